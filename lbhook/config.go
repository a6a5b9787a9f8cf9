package lbhook

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults for the zero values of Config and ClientOptions.
const (
	// DefaultRequestTimeout bounds each HTTP call, like Singularity's
	// loadBalancerRequestTimeoutMillis (2000 ms).
	DefaultRequestTimeout = 2 * time.Second
	// DefaultPollInterval is the wait between GETs of a request that is in
	// progress. Baragon's worker advances a request once a second; polling
	// twice as often halves the time we notice its end.
	DefaultPollInterval = 500 * time.Millisecond
	// DefaultAddDeadline is how long an ADD may stay unfinished before it is
	// cancelled. Singularity has no such deadline; we need one so that a
	// stuck LB cannot hold a task forever. Baragon's worker runs once a
	// second and a request needs two of its runs (apply, then check the
	// agents), so a lone request takes 1-2 s, and about 3 s per request
	// once requests queue (one batch per service at a time, ten requests
	// per run): a minute covers a queue of some twenty requests, while an
	// LB that is down is reported within seconds (OnUnanswered), not at
	// the deadline.
	DefaultAddDeadline = time.Minute
	// DefaultRemoveDeadline is how long a REMOVE may take, retries included.
	// It is spent before the workload is signalled, so it is kept short,
	// but not shorter than Baragon needs: with its 1 s worker a REMOVE that
	// queues behind two other requests of the service (a failover's ADD and
	// an earlier REMOVE) needs about 3 × 3 s. 5 s missed that; 10 s fits it
	// with the poll interval to spare. A REMOVE that runs out is cancelled,
	// and the service's state then tells whether it was applied anyway.
	DefaultRemoveDeadline = 10 * time.Second
	// DefaultAuthKeyEnv is the environment variable read for the auth key
	// when Config.AuthKeyFile is empty.
	DefaultAuthKeyEnv = "SINGLETON_LB_AUTHKEY"
	// authKeyParam is Baragon's auth query parameter (BaragonAuthFilter).
	authKeyParam = "authkey"
)

// The least value of each duration (zero still takes the default). Below
// the first two the root supervisor would busy-loop against an LB API of
// the job's choosing; a deadline shorter than one poll ends every request
// before its first answer could be read.
const (
	MinRequestTimeout = 100 * time.Millisecond
	MinPollInterval   = 100 * time.Millisecond
	MinAddDeadline    = MinPollInterval
	MinRemoveDeadline = MinPollInterval
)

// idPattern is Baragon's pattern for request and service ids.
var idPattern = regexp.MustCompile(`^[^\s/|]+$`)

// Config is the LB block of a task: where Baragon is and what to register.
// Field names follow the block (uri, service_id, base_path, groups,
// port_label, owners, options, template_name, domains, additional_paths,
// group, rack_id, request_timeout, poll_interval, add_deadline,
// remove_deadline, authkey_file, ca_file). Zero durations take the defaults.
type Config struct {
	// URI is the full URL of Baragon's request collection, e.g.
	// http://baragon:8080/baragon/v2/request. A trailing "/" is ignored.
	URI string
	// ServiceID is Baragon's serviceId ([^\s/|]+).
	ServiceID string
	// BasePath is the service's serviceBasePath, e.g. "/web".
	BasePath string
	// Groups are the load balancer groups; at least one.
	Groups []string
	// PortLabel names the task port whose host:port is registered. The
	// caller resolves it; this package only requires it to be set.
	PortLabel string
	// Owners are the service owners (may be empty).
	Owners []string
	// Options feeds Baragon's templates: any JSON values, e.g. the list
	// nginxExtraConfigs or numbers (may be nil: omitted on the wire).
	Options map[string]any
	// TemplateName selects a Baragon template (templateName; "" omits it).
	TemplateName string
	// Domains are the service's domains (Singularity's
	// loadBalancerDomains).
	Domains []string
	// AdditionalPaths are routes besides BasePath (Singularity's
	// loadBalancerAdditionalRoutes).
	AdditionalPaths []string
	// Group is our upstream's group ("" sends none: Baragon's "default";
	// Singularity's loadBalancerUpstreamGroup).
	Group string
	// RackID is our upstream's rackId ("" omits it).
	RackID string
	// RequestTimeout bounds each HTTP call (default 2s, at least 100ms).
	RequestTimeout time.Duration
	// PollInterval is the wait between polls (default 500ms, at least 100ms).
	PollInterval time.Duration
	// AddDeadline is when an unfinished ADD is cancelled (default 1m, at
	// least 100ms).
	AddDeadline time.Duration
	// RemoveDeadline bounds a REMOVE with its retries (default 10s, at least 100ms).
	RemoveDeadline time.Duration
	// AuthKeyFile holds the auth key. When empty, the key comes from the
	// environment (ClientOptions.AuthKeyEnv), or there is none.
	AuthKeyFile string
	// CAFile is a PEM bundle that replaces the system roots for https.
	CAFile string
	// AuthKey and CAPEM are the contents of an auth key file and a CA
	// bundle that the caller has read itself, for callers that must not
	// open a path they were given (the driver, which runs as root, reads
	// them from the task's secrets dir). They take the place of AuthKeyFile
	// and CAFile.
	AuthKey string
	CAPEM   []byte
}

// WithDefaults returns c with zero durations replaced by the defaults.
func (c Config) WithDefaults() Config {
	c.RequestTimeout = orDefault(c.RequestTimeout, DefaultRequestTimeout)
	c.PollInterval = orDefault(c.PollInterval, DefaultPollInterval)
	c.AddDeadline = orDefault(c.AddDeadline, DefaultAddDeadline)
	c.RemoveDeadline = orDefault(c.RemoveDeadline, DefaultRemoveDeadline)
	return c
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Validate checks every field and returns all problems at once, each naming
// its field. It reads authkey_file and ca_file to prove they are usable.
func (c Config) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	_, err := parseRequestURI(c.URI)
	add(err)
	add(validateServiceID(c.ServiceID))
	if c.BasePath == "" {
		add(errors.New("base_path is required (Baragon's serviceBasePath, e.g. \"/web\")"))
	}
	add(validateGroups(c.Groups))
	if strings.TrimSpace(c.PortLabel) == "" {
		add(errors.New("port_label is required: it names the port whose host:port is registered"))
	}
	for i, o := range c.Owners {
		if strings.TrimSpace(o) == "" {
			add(fmt.Errorf("owners[%d] is empty", i))
		}
	}
	add(validateStrings("domains", c.Domains))
	add(validateStrings("additional_paths", c.AdditionalPaths))
	add(validateTag("group", c.Group))
	add(validateTag("rack_id", c.RackID))
	if _, err := json.Marshal(c.Options); err != nil {
		add(fmt.Errorf("options cannot be sent as JSON: %w", err))
	}
	add(validateDuration("request_timeout", c.RequestTimeout, MinRequestTimeout))
	add(validateDuration("poll_interval", c.PollInterval, MinPollInterval))
	add(validateDuration("add_deadline", c.AddDeadline, MinAddDeadline))
	add(validateDuration("remove_deadline", c.RemoveDeadline, MinRemoveDeadline))
	switch {
	case c.AuthKey != "":
		_, err := parseAuthKey(c.AuthKey, "authkey_file")
		add(err)
	case c.AuthKeyFile != "":
		_, err := readAuthKeyFile(c.AuthKeyFile)
		add(err)
	}
	add(c.validateCA())
	return errors.Join(errs...)
}

// parseRequestURI checks uri and returns it without a trailing "/".
func parseRequestURI(uri string) (*url.URL, error) {
	if uri == "" {
		return nil, errors.New("uri is required: the full URL of the request collection, e.g. http://baragon:8080/baragon/v2/request")
	}
	u, err := url.Parse(strings.TrimRight(uri, "/"))
	if err != nil {
		// url.Error quotes the input; it carries no auth key (that never
		// goes in uri), but strip userinfo all the same.
		return nil, fmt.Errorf("uri is not a URL: %w", errors.Unwrap(err))
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("uri %q: scheme must be http or https", u.Redacted())
	case u.Host == "":
		return nil, fmt.Errorf("uri %q: host is missing", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("uri %q: must not have a query; the auth key comes from authkey_file or the environment", u.Redacted())
	case u.Fragment != "":
		return nil, fmt.Errorf("uri %q: must not have a fragment", u.Redacted())
	case !strings.Contains(u.Path, "request"):
		return nil, fmt.Errorf("uri %q: path must end in Baragon's request collection (e.g. /baragon/v2/request); the state URL is derived by replacing \"request\" with \"state\"", u.Redacted())
	}
	return u, nil
}

func validateServiceID(id string) error {
	switch {
	case id == "":
		return errors.New("service_id is required")
	case !idPattern.MatchString(id):
		return fmt.Errorf("service_id %q cannot contain whitespace, '/', or '|'", id)
	}
	return nil
}

func validateGroups(groups []string) error {
	if len(groups) == 0 {
		return errors.New("groups needs at least one load balancer group")
	}
	seen := make(map[string]bool, len(groups))
	for i, g := range groups {
		switch {
		case g == "":
			return fmt.Errorf("groups[%d] is empty", i)
		case seen[g]:
			return fmt.Errorf("groups[%d] %q is listed twice", i, g)
		}
		seen[g] = true
	}
	return nil
}

// validateStrings refuses empty entries.
func validateStrings(name string, list []string) error {
	for i, v := range list {
		if strings.TrimSpace(v) == "" {
			return fmt.Errorf("%s[%d] is empty", name, i)
		}
	}
	return nil
}

// validateTag checks an upstream's group or rackId as Baragon does: at
// most 100 characters, no whitespace, no '|'.
func validateTag(name, v string) error {
	switch {
	case len(v) > 100:
		return fmt.Errorf("%s %q is longer than 100 characters", name, v)
	case strings.ContainsAny(v, " \t\r\n|"):
		return fmt.Errorf("%s %q cannot contain whitespace or '|'", name, v)
	}
	return nil
}

// validateDuration refuses a negative d, and a set d below min.
func validateDuration(name string, d, min time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%s must not be negative (got %s)", name, d)
	case d > 0 && d < min:
		return fmt.Errorf("%s = %s is below its minimum of %s", name, d, min)
	}
	return nil
}

// validateCA checks that a set CA bundle holds a certificate and is used with https.
func (c Config) validateCA() error {
	if c.CAFile == "" && len(c.CAPEM) == 0 {
		return nil
	}
	if _, err := c.caPool(); err != nil {
		return err
	}
	if u, err := url.Parse(c.URI); err == nil && u.Scheme == "http" {
		return errors.New("ca_file is set but uri is plain http: use an https uri, or drop ca_file")
	}
	return nil
}

// readAuthKeyFile reads and trims the auth key. The error names the file but
// never its content.
func readAuthKeyFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("authkey_file: %w", err)
	}
	return parseAuthKey(string(b), "authkey_file "+path)
}

// parseAuthKey trims a key read from source and checks it is one line.
func parseAuthKey(raw, source string) (string, error) {
	key := strings.TrimSpace(raw)
	if key == "" {
		return "", fmt.Errorf("%s is empty", source)
	}
	if strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("%s holds more than one line", source)
	}
	return key, nil
}

// caPool is the CA bundle of CAPEM or CAFile; nil means the system roots.
func (c Config) caPool() (*x509.CertPool, error) {
	pem, source := c.CAPEM, "ca_file"
	if len(pem) == 0 {
		if c.CAFile == "" {
			return nil, nil
		}
		b, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pem, source = b, "ca_file "+c.CAFile
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", source)
	}
	return pool, nil
}

// ClientOptions are the programmatic settings of a Client that are not part
// of a task's LB block.
type ClientOptions struct {
	// Logger receives the client's logs (default: a null logger).
	Logger hclog.Logger
	// QueryParams are added to POST, GET and DELETE, not to the state GET,
	// like Singularity's loadBalancerQueryParams. "authkey" is refused here:
	// the key comes from Config.AuthKeyFile or the environment.
	QueryParams map[string]string
	// AuthKeyEnv names the environment variable read for the auth key when
	// Config.AuthKeyFile is empty (default DefaultAuthKeyEnv).
	AuthKeyEnv string
	// Getenv reads the environment (default os.Getenv).
	Getenv func(string) string
	// CancelWait bounds the wait for a final state after a cancel
	// (default 2×RequestTimeout + 4×PollInterval).
	CancelWait time.Duration
	// MaxRetryWait caps the backoff between tries after calls that got no
	// usable answer (default 8×PollInterval): an LB API that comes back is
	// tried again within it.
	MaxRetryWait time.Duration
	// OnUnanswered, if set, hears of calls that got no usable answer
	// (transport error, timeout, 5xx, unreadable answer): the first of each
	// run of them, then at most once per UnansweredEvery while it lasts, so
	// that an operator learns within seconds that the LB API is not
	// answering, not at the request's deadline. It runs on the caller's
	// goroutine and must not block.
	OnUnanswered func(Unanswered)
	// UnansweredEvery is the least time between two OnUnanswered calls of
	// one request (default 30s).
	UnansweredEvery time.Duration
	// OnRequest, if set, hears of every request a Hook drove to its end
	// (metrics). It runs on the caller's goroutine and must not block.
	OnRequest func(RequestReport)
}

// RequestReport is one request a Hook ran (Client.Run) and how it ended.
type RequestReport struct {
	// Op is "add", "readd" (an ADD after the first of one registration)
	// or "remove".
	Op string
	// Result is the final state in lower case ("success", "failed",
	// "canceled", "invalid_request_noop"), or "unknown" when none was
	// seen (the deadline and the cancel wait passed, or the call was cut
	// short).
	Result string
	Took   time.Duration
}

// DefaultUnansweredEvery is the default ClientOptions.UnansweredEvery.
const DefaultUnansweredEvery = 30 * time.Second

// Unanswered describes calls of one request that got no usable answer.
type Unanswered struct {
	// RequestID is the request being driven.
	RequestID string
	// Err is the latest failed call; its URL never shows the auth key.
	Err *CallError
	// Since is when the first failed call of this run of failures ended.
	Since time.Time
	// Calls counts the failed calls since then.
	Calls int
}

func (o ClientOptions) withDefaults(cfg Config) ClientOptions {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.AuthKeyEnv == "" {
		o.AuthKeyEnv = DefaultAuthKeyEnv
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.CancelWait == 0 {
		o.CancelWait = 2*cfg.RequestTimeout + 4*cfg.PollInterval
	}
	if o.MaxRetryWait <= 0 {
		o.MaxRetryWait = 8 * cfg.PollInterval
	}
	o.MaxRetryWait = max(o.MaxRetryWait, cfg.PollInterval)
	if o.UnansweredEvery <= 0 {
		o.UnansweredEvery = DefaultUnansweredEvery
	}
	return o
}

func (o ClientOptions) validate() error {
	for k := range o.QueryParams {
		if k == authKeyParam {
			return errors.New("query params must not set authkey: use authkey_file or the " + o.AuthKeyEnv + " environment variable")
		}
		if k == "" {
			return errors.New("query params: empty parameter name")
		}
	}
	if o.CancelWait < 0 {
		return fmt.Errorf("cancel wait must not be negative (got %s)", o.CancelWait)
	}
	return nil
}

// validateUpstream checks that u is "host:port" with a numeric port.
func validateUpstream(u UpstreamInfo) error {
	host, port, err := net.SplitHostPort(u.Upstream)
	if err != nil {
		return fmt.Errorf("upstream %q is not host:port: %w", u.Upstream, err)
	}
	if host == "" {
		return fmt.Errorf("upstream %q has no host", u.Upstream)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("upstream %q: port must be 1-65535", u.Upstream)
	}
	if strings.ContainsAny(u.RackID, " \t\r\n|") {
		return fmt.Errorf("upstream %q: rackId %q cannot contain whitespace or '|'", u.Upstream, u.RackID)
	}
	if strings.ContainsAny(u.Group, " \t\r\n|") {
		return fmt.Errorf("upstream %q: group %q cannot contain whitespace or '|'", u.Upstream, u.Group)
	}
	return nil
}
