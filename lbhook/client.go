package lbhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ErrNotFound is matched (errors.Is) by a CallError for an HTTP 404: an
// unknown request id on GET, or an unknown service on the state GET.
var ErrNotFound = errors.New("not found")

// CallError is a failed HTTP call. State says how the failure counts, as in
// Singularity: UNKNOWN (transport error, timeout, 5xx, 408, 429, unparseable
// 2xx, any non-2xx on GET or DELETE) or FAILED (any other non-2xx on POST).
// Its URL and Body never show the auth key.
type CallError struct {
	// Method is POST, GET or DELETE.
	Method string
	// URL is the request URL with the auth key redacted.
	URL string
	// StatusCode is 0 when no HTTP answer arrived.
	StatusCode int
	// Body is the start of the answer body, auth key redacted.
	Body string
	// State is UNKNOWN or FAILED.
	State RequestState
	// Err is the transport or decode error, if any.
	Err error
}

// Error describes the call like Singularity's "Response status code N: body".
func (e *CallError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Method, e.URL)
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, ": response status code %d", e.StatusCode)
		if e.Body != "" {
			fmt.Fprintf(&b, ": %s", e.Body)
		}
	}
	if e.Err != nil {
		// A TLS error can list every name of the LB's certificate.
		fmt.Fprintf(&b, ": %s", clipLB(e.Err.Error()))
	}
	return b.String()
}

// Unwrap returns the transport or decode error.
func (e *CallError) Unwrap() error { return e.Err }

// Is matches ErrNotFound for a 404.
func (e *CallError) Is(target error) bool {
	return target == ErrNotFound && e.StatusCode == http.StatusNotFound
}

// Client talks to one Baragon service for one LB configuration. It is safe
// for concurrent use.
type Client struct {
	cfg        Config
	opts       ClientOptions
	requestURI string // the request collection, no trailing "/"
	stateURI   string // requestURI with every "request" replaced by "state"
	authKey    string
	redact     redactor
	http       *http.Client
	transport  *http.Transport
	log        hclog.Logger
}

// NewClient validates cfg (after defaults), reads the auth key and the CA
// file, and returns a Client.
func NewClient(cfg Config, opts ClientOptions) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("lb config: %w", err)
	}
	opts = opts.withDefaults(cfg)
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("lb client: %w", err)
	}
	key, err := loadAuthKey(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("lb config: %w", err)
	}
	tr, err := newTransport(cfg)
	if err != nil {
		return nil, fmt.Errorf("lb config: %w", err)
	}
	requestURI := strings.TrimRight(cfg.URI, "/")
	c := &Client{
		cfg:        cfg,
		opts:       opts,
		requestURI: requestURI,
		stateURI:   stateURIFor(requestURI),
		authKey:    key,
		redact:     redactor{secret: key},
		transport:  tr,
		http: &http.Client{
			Transport: tr,
			// A redirect would carry the auth key to another URL; Baragon
			// never redirects, so a 3xx is answered as is.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		log: opts.Logger.Named("lbhook"),
	}
	if strings.Count(requestURI, "request") > 1 {
		c.log.Warn(`lb uri contains "request" more than once; like Singularity, every occurrence is replaced to build the state URL`,
			"state_uri", c.redact.URL(c.stateURI))
	}
	return c, nil
}

// stateURIFor derives the state collection URL exactly as Singularity does:
// String.replace("request", "state"), which replaces every occurrence, host
// and path alike.
func stateURIFor(requestURI string) string {
	return strings.ReplaceAll(requestURI, "request", "state")
}

func loadAuthKey(cfg Config, opts ClientOptions) (string, error) {
	if cfg.AuthKey != "" {
		return parseAuthKey(cfg.AuthKey, "authkey_file")
	}
	if cfg.AuthKeyFile != "" {
		return readAuthKeyFile(cfg.AuthKeyFile)
	}
	return strings.TrimSpace(opts.Getenv(opts.AuthKeyEnv)), nil
}

func newTransport(cfg Config) (*http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	pool, err := cfg.caPool()
	if err != nil {
		return nil, err
	}
	tlsCfg.RootCAs = pool
	tr.TLSClientConfig = tlsCfg
	return tr, nil
}

// Config returns the client's configuration, defaults applied.
func (c *Client) Config() Config { return c.cfg }

// Close releases idle connections.
func (c *Client) Close() { c.transport.CloseIdleConnections() }

// Post enqueues req (POST {uri}). On a failed call the returned response
// carries the state the failure counts as (UNKNOWN or FAILED) and the error
// text as its message, and the error is a *CallError.
func (c *Client) Post(ctx context.Context, req BaragonRequest) (BaragonResponse, error) {
	target := c.requestURL("", true)
	body, err := json.Marshal(req)
	if err != nil {
		return c.failure(req.LoadBalancerRequestID, &CallError{
			Method: http.MethodPost, URL: c.redact.URL(target), State: StateUnknown,
			Err: fmt.Errorf("encode request: %w", err),
		})
	}
	return c.callRequest(ctx, http.MethodPost, req.LoadBalancerRequestID, target, body)
}

// Get reads the state of request id (GET {uri}/{id}). A 404 gives a
// *CallError that matches ErrNotFound. Baragon serves it without auth
// (@NoAuth), so the auth key is not sent: it would only end up in access
// logs at every poll.
func (c *Client) Get(ctx context.Context, id string) (BaragonResponse, error) {
	return c.callRequest(ctx, http.MethodGet, id, c.requestURL(id, false), nil)
}

// Cancel asks Baragon to cancel request id (DELETE {uri}/{id}). Baragon
// answers CANCELING if it could cancel, the current state if the request is
// already final, and CANCELED "Request {id} does not exist" for an unknown id.
func (c *Client) Cancel(ctx context.Context, id string) (BaragonResponse, error) {
	return c.callRequest(ctx, http.MethodDelete, id, c.requestURL(id, true), nil)
}

// ServiceState reads the configured service's state
// (GET {state uri}/{serviceId}, no query parameters). An unknown service
// gives a *CallError that matches ErrNotFound.
func (c *Client) ServiceState(ctx context.Context) (BaragonServiceState, error) {
	target := c.stateURI + "/" + url.PathEscape(c.cfg.ServiceID)
	status, body, err := c.do(ctx, http.MethodGet, target, nil)
	ce := &CallError{Method: http.MethodGet, URL: c.redact.URL(target), StatusCode: status, State: StateUnknown}
	switch {
	case err != nil:
		ce.Err = err
		return BaragonServiceState{}, ce
	case status < 200 || status > 299:
		ce.Body = c.excerpt(body)
		return BaragonServiceState{}, ce
	}
	st, err := decodeServiceState(body)
	if err != nil {
		ce.Err = err
		return BaragonServiceState{}, ce
	}
	return st, nil
}

// requestURL is {uri} or {uri}/{id}, with the query parameters and, when
// auth is set, the auth key. The id is path-escaped, which leaves every
// Baragon-valid id unchanged except for '?', '#' and '%'.
func (c *Client) requestURL(id string, auth bool) string {
	target := c.requestURI
	if id != "" {
		target += "/" + url.PathEscape(id)
	}
	q := url.Values{}
	for k, v := range c.opts.QueryParams {
		q.Set(k, v)
	}
	if auth && c.authKey != "" {
		q.Set(authKeyParam, c.authKey)
	}
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	return target
}

// callRequest runs one call on the request resource and classifies it.
func (c *Client) callRequest(ctx context.Context, method, id, target string, body []byte) (BaragonResponse, error) {
	status, respBody, err := c.do(ctx, method, target, body)
	ce := &CallError{Method: method, URL: c.redact.URL(target), StatusCode: status, State: StateUnknown}
	if err != nil {
		ce.Err = err
		return c.failure(id, ce)
	}
	if status >= 200 && status <= 299 {
		resp, err := DecodeResponse(respBody)
		if err != nil {
			ce.Body = c.excerpt(respBody)
			ce.Err = err
			return c.failure(id, ce)
		}
		if resp.LoadBalancerRequestID != "" && resp.LoadBalancerRequestID != id {
			c.log.Warn("Baragon answered for another request id", "request_id", id, "answer_id", resp.LoadBalancerRequestID)
		}
		return resp, nil
	}
	ce.Body = c.excerpt(respBody)
	ce.State = failureState(method, status)
	return c.failure(id, ce)
}

// failureState decides how a non-2xx answer counts. Singularity counts any
// non-2xx POST as FAILED except 504. We count every 5xx (and 408, 429) on
// POST as UNKNOWN instead, so the same id is POSTed again: the gateway or
// Baragon may have stored the request before failing, and POST is idempotent
// by id. GET and DELETE never fail a request: a non-2xx there is UNKNOWN.
func failureState(method string, status int) RequestState {
	if method != http.MethodPost {
		return StateUnknown
	}
	switch {
	case status >= 500, status == http.StatusRequestTimeout, status == http.StatusTooManyRequests:
		return StateUnknown
	}
	return StateFailed
}

// failure turns a CallError into the response Singularity would synthesize.
func (c *Client) failure(id string, ce *CallError) (BaragonResponse, error) {
	return BaragonResponse{LoadBalancerRequestID: id, LoadBalancerState: ce.State, Message: ce.Error()}, ce
}

// excerpt returns the start of an answer body, auth key redacted.
func (c *Client) excerpt(body []byte) string {
	// Redacted before it is cut, so that no part of the key survives a cut.
	return clipLB(c.redact.String(strings.TrimSpace(string(body))))
}

// do sends one HTTP request bounded by RequestTimeout and reads at most
// maxBodyBytes of the answer. Errors are redacted.
func (c *Client) do(ctx context.Context, method, target string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, reader)
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", c.redact.Error(err))
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		err = c.redact.Error(err)
		c.log.Debug("lb call failed", "method", method, "url", c.redact.URL(target), "duration", time.Since(start), "error", err)
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes+1))
	c.log.Debug("lb call", "method", method, "url", c.redact.URL(target), "status", resp.StatusCode, "duration", time.Since(start))
	if err != nil {
		return resp.StatusCode, data, fmt.Errorf("read body: %w", c.redact.Error(err))
	}
	if len(data) > maxBodyBytes {
		return resp.StatusCode, data[:maxBodyBytes], fmt.Errorf("answer body exceeds %d bytes", maxBodyBytes)
	}
	return resp.StatusCode, data, nil
}
