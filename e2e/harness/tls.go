package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
)

// TLS makes the agents serve their HTTP API over HTTPS only, and ask every
// HTTPS client for a certificate signed by CA (mutual TLS: tls { http =
// true, verify_https_client = true }). The harness's own API clients and
// the nomad CLI (Agent.Env) present Client; the Task API socket stays
// plain, as in Nomad.
type TLS struct {
	CA, Server, Client CertFiles
}

// CertFiles are PEM files: a certificate and its key (none for a CA used
// only to verify).
type CertFiles struct{ Cert, Key string }

// TLSServerName is the name in the agents' certificate besides 127.0.0.1:
// Nomad's own naming for a server of region global.
const TLSServerName = "server.global.nomad"

// NewTLS makes, with crypto/x509, a CA and two certificates it signs in a
// temporary dir: the agents' (for 127.0.0.1, localhost and
// TLSServerName) and a client's, for mutual TLS. Each call makes a new CA.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, pkix.Name{CommonName: "e2e CA"}, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	})
	server, serverKey := newCert(t, ca, caKey, pkix.Name{CommonName: TLSServerName}, func(c *x509.Certificate) {
		c.DNSNames = []string{TLSServerName, "localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	})
	client, clientKey := newCert(t, ca, caKey, pkix.Name{CommonName: "e2e client"}, func(c *x509.Certificate) {
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	write := func(name string, der []byte, key *ecdsa.PrivateKey) CertFiles {
		f := CertFiles{Cert: filepath.Join(dir, name+".pem")}
		writePEM(t, f.Cert, "CERTIFICATE", der)
		if key != nil {
			b, err := x509.MarshalECPrivateKey(key)
			if err != nil {
				t.Fatal(err)
			}
			f.Key = filepath.Join(dir, name+"-key.pem")
			writePEM(t, f.Key, "EC PRIVATE KEY", b)
		}
		return f
	}
	return &TLS{
		CA:     write("ca", ca.Raw, nil),
		Server: write("server", server.Raw, serverKey),
		Client: write("client", client.Raw, clientKey),
	}
}

// newCert makes a certificate for subject, signed by parent (self-signed
// when parent is nil), shaped by edit.
func newCert(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, subject pkix.Name,
	edit func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	edit(tmpl)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// apiTLS is the TLS configuration of the harness's API clients.
func (c *TLS) apiTLS() *api.TLSConfig {
	return &api.TLSConfig{CACert: c.CA.Cert, ClientCert: c.Client.Cert, ClientKey: c.Client.Key}
}

// env is the nomad CLI's TLS variables for this cluster.
func (c *TLS) env() []string {
	return []string{"NOMAD_CACERT=" + c.CA.Cert, "NOMAD_CLIENT_CERT=" + c.Client.Cert, "NOMAD_CLIENT_KEY=" + c.Client.Key}
}

// config is the agent's tls block.
func (c *TLS) config() string {
	return "tls {\n  http                = true\n  ca_file             = \"" + c.CA.Cert + "\"\n" +
		"  cert_file           = \"" + c.Server.Cert + "\"\n  key_file            = \"" + c.Server.Key + "\"\n" +
		"  verify_https_client = true\n}"
}
