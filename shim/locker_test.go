package shim

import (
	"reflect"
	"testing"

	"github.com/hashicorp/nomad/api"
)

// The TLS settings outside a task are Nomad's CLI's: each flag given wins
// over its NOMAD_* variable, a variable fills what no flag gives.
func TestCLITLSFlagsOverVariables(t *testing.T) {
	t.Setenv("NOMAD_CACERT", "env-ca.pem")
	t.Setenv("NOMAD_CAPATH", "env-cas")
	t.Setenv("NOMAD_CLIENT_CERT", "env-cert.pem")
	t.Setenv("NOMAD_CLIENT_KEY", "env-key.pem")
	t.Setenv("NOMAD_TLS_SERVER_NAME", "env.nomad")
	t.Setenv("NOMAD_SKIP_VERIFY", "false")
	got := cliTLS(api.TLSConfig{CACert: "flag-ca.pem", ClientKey: "flag-key.pem", Insecure: true})
	want := api.TLSConfig{CACert: "flag-ca.pem", CAPath: "env-cas", ClientCert: "env-cert.pem", ClientKey: "flag-key.pem",
		TLSServerName: "env.nomad", Insecure: true}
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("got %+v, want %+v", *got, want)
	}
	t.Setenv("NOMAD_SKIP_VERIFY", "true")
	if got := cliTLS(api.TLSConfig{}); !got.Insecure || got.CACert != "env-ca.pem" {
		t.Errorf("variables alone: got %+v", *got)
	}
}
