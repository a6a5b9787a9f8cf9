package shim

import (
	"os"

	"github.com/hashicorp/nomad/api"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// NewLocker resolves the endpoint and builds the lease client for spec's
// lock; its holder record (with the upstream that the next holder removes
// from the load balancer) is written into the lock on acquire.
func NewLocker(spec Spec, log hclog.Logger) (*lockclient.Locker, error) {
	cfg, holder := spec.Config, spec.Holder
	ep, err := endpointFor(cfg.Address)
	if cfg.RootSecretsDir != "" {
		ep, err = lockclient.DiscoverRootEndpoint(cfg.RootSecretsDir, os.Getenv)
	} else if err == nil && !ep.TaskAPI {
		ep.TLS, ep.Region = cliTLS(cfg.TLS), cfg.Region
	}
	if err != nil {
		return nil, err
	}
	log.Debug("nomad endpoint", "endpoint", ep.String())
	switch {
	case cfg.LB != nil:
		holder.Upstream = cfg.LB.Upstream // the next holder removes it from the LB
	case cfg.Upstream != "":
		// -upstream-port: `lock lb follow` registers it; the next holder's
		// ADD swaps it out, whether we stopped cleanly or died.
		holder.Upstream = cfg.Upstream
	}
	return lockclient.New(lockclient.Config{
		Endpoint:   ep,
		Namespace:  cfg.Namespace,
		Path:       cfg.Path,
		Timing:     cfg.Timing(),
		Holder:     holder,
		Holders:    cfg.Holders,
		PreferSlot: cfg.AllocIndex,
		MaxRetry:   cfg.MaxRetry,
		Heartbeat:  spec.Heartbeat(),
		Logger:     log,
	})
}

func endpointFor(address string) (lockclient.Endpoint, error) {
	if address == "" {
		return lockclient.DiscoverEndpoint(os.Getenv)
	}
	getenv := func(k string) string {
		switch k {
		case "NOMAD_UNIX_ADDR", "NOMAD_SECRETS_DIR":
			return "" // an explicit -address wins over the task's socket
		case "NOMAD_ADDR":
			return address
		}
		return os.Getenv(k)
	}
	ep, err := lockclient.DiscoverEndpoint(getenv)
	if err != nil {
		return ep, err
	}
	if tok, err := lockclient.DiscoverEndpoint(os.Getenv); err == nil && ep.Token == "" {
		ep.Token = tok.Token
	}
	return ep, nil
}

// cliTLS is the TLS configuration Nomad's CLI would use: the NOMAD_CACERT,
// NOMAD_CAPATH, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY, NOMAD_TLS_SERVER_NAME
// and NOMAD_SKIP_VERIFY variables, each overridden by its flag if given
// (Nomad's command/meta.go, clientConfig).
func cliTLS(flags api.TLSConfig) *api.TLSConfig {
	tls := api.DefaultConfig().TLSConfig
	for _, f := range []struct {
		dst  *string
		flag string
	}{
		{&tls.CACert, flags.CACert}, {&tls.CAPath, flags.CAPath}, {&tls.ClientCert, flags.ClientCert},
		{&tls.ClientKey, flags.ClientKey}, {&tls.TLSServerName, flags.TLSServerName},
	} {
		if f.flag != "" {
			*f.dst = f.flag
		}
	}
	if flags.Insecure {
		tls.Insecure = true
	}
	return tls
}
