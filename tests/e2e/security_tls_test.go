package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/tests/backend"
	"github.com/tsproxy/tsproxy/upstream"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, as PEM files.
type testPKI struct {
	ca                    string
	serverCert, serverKey string
	clientCert, clientKey string
	clientPEM             string // client certificate and key in one file (tlsCertificateKeyFile)
	caKey                 *ecdsa.PrivateKey
	caCert                *x509.Certificate
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	dir := t.TempDir()
	p := &testPKI{}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tsproxy security test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.caCert, _ = x509.ParseCertificate(caDER)
	p.ca = writePEM(t, dir, "ca.pem", pemBlock("CERTIFICATE", caDER))
	cert, key := p.issue(t, 2, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	p.serverCert, p.serverKey = writePEM(t, dir, "server.pem", cert), writePEM(t, dir, "server.key", key)
	cert, key = p.issue(t, 3, "tsproxy-test-client", x509.ExtKeyUsageClientAuth)
	p.clientCert, p.clientKey = writePEM(t, dir, "client.pem", cert), writePEM(t, dir, "client.key", key)
	p.clientPEM = writePEM(t, dir, "client-both.pem", append(append([]byte{}, cert...), key...))
	return p
}

// issue signs a certificate for cn (an IP address goes in the SANs too).
func (p *testPKI) issue(t testing.TB, serial int64, cn string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if ip := net.ParseIP(cn); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER)
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func writePEM(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// proxyToUpstream starts a proxy that dials addr with the given TLS config
// (nil: plain TCP) and buckets db.readings.
func proxyToUpstream(t *testing.T, db, addr string, cfg *tls.Config) *testProxy {
	t.Helper()
	return startProxy(t, proxyOptions{
		yaml:        readingsRule(db, 100),
		upstreamURI: "mongodb://" + addr + "/",
		edit: func(o *proxy.Options) {
			d, err := upstream.NewDialer(upstream.Options{URI: "mongodb://" + addr + "/", DialTimeout: 2 * time.Second, TLS: cfg})
			if err != nil {
				t.Fatal(err)
			}
			o.Dialer = d
		},
	})
}

// writeAndRead stores n bucketed events and a plain document through c and
// reads them back; it returns the first error.
func writeAndRead(ctx context.Context, c *mongo.Client, db string, n int) error {
	docs := make([]any, n)
	for i, e := range genEvents(n, 3, 1, uint64(n)) {
		docs[i] = e.doc()
	}
	if _, err := c.Database(db).Collection("readings").InsertMany(ctx, docs); err != nil {
		return err
	}
	if _, err := c.Database(db).Collection("items").InsertOne(ctx, bson.D{{Key: "v", Value: n}}); err != nil {
		return err
	}
	got, err := c.Database(db).Collection("readings").CountDocuments(ctx, bson.D{})
	if err != nil {
		return err
	}
	if got != int64(n) {
		return fmt.Errorf("read back %d events, want %d", got, n)
	}
	return nil
}

// TestUpstreamTLS: the proxy speaks TLS to an upstream (the ferretdb
// command listening with TLS only on that port), verifying its certificate
// against the test CA. Bucketed writes and reads go through; a proxy that
// trusts another CA, or speaks plain TCP to the TLS port, serves nothing
// and its clients get a prompt error.
func TestUpstreamTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	fdb := startFerretDB(t, backend.FerretDBOptions{TLSCert: pki.serverCert, TLSKey: pki.serverKey})
	ctx := ctxFor(t)
	good, err := upstream.ClientTLS(upstream.TLSFiles{CAFile: pki.ca})
	if err != nil {
		t.Fatal(err)
	}
	db := uniqueDB(t)
	p := proxyToUpstream(t, db, fdb.TLSAddr, good)
	if err := writeAndRead(ctx, connect(t, p.URI()), db, 250); err != nil {
		t.Fatalf("through a TLS upstream: %v", err)
	}
	// The same through the URI's own TLS options (upstream.uri ...?tls=true).
	p2 := startProxy(t, proxyOptions{yaml: readingsRule(db, 100), upstreamURI: "mongodb://" + fdb.TLSAddr + "/?tls=true&tlsCAFile=" + pki.ca})
	if err := writeAndRead(ctx, connect(t, p2.URI()), uniqueDB(t), 40); err != nil {
		t.Fatalf("through a TLS upstream named by the URI: %v", err)
	}

	other := newTestPKI(t)
	wrongCA, err := upstream.ClientTLS(upstream.TLSFiles{CAFile: other.ca})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*tls.Config{"an untrusted upstream certificate": wrongCA, "plain TCP to a TLS port": nil} {
		bad := proxyToUpstream(t, db, fdb.TLSAddr, cfg)
		c := connect(t, bad.URI())
		octx, cancel := context.WithTimeout(ctx, 20*time.Second)
		start := time.Now()
		_, err := c.Database(db).Collection("readings").InsertOne(octx, genEvents(1, 1, 1, 5)[0].doc())
		cancel()
		if err == nil {
			t.Fatalf("%s: insert succeeded", name)
		}
		// The dial's first round trip finds the dead link: a prompt
		// HostUnreachable, not a closed connection the driver waits out.
		assertPromptUnreachable(t, name, err, time.Since(start))
	}
	if n, err := connect(t, p.URI()).Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != 250 {
		t.Fatalf("events after the refused proxies: %d %v", n, err)
	}
}

// TestUpstreamMutualTLS: an upstream that requires a client certificate
// serves the proxy that presents one signed by its CA, and refuses one
// that presents none.
func TestUpstreamMutualTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	fdb := startFerretDB(t, backend.FerretDBOptions{TLSCert: pki.serverCert, TLSKey: pki.serverKey, TLSCA: pki.ca})
	ctx := ctxFor(t)
	withCert, err := upstream.ClientTLS(upstream.TLSFiles{CAFile: pki.ca, CertFile: pki.clientCert, KeyFile: pki.clientKey})
	if err != nil {
		t.Fatal(err)
	}
	db := uniqueDB(t)
	if err := writeAndRead(ctx, connect(t, proxyToUpstream(t, db, fdb.TLSAddr, withCert).URI()), db, 120); err != nil {
		t.Fatalf("proxy with a client certificate: %v", err)
	}
	noCert, err := upstream.ClientTLS(upstream.TLSFiles{CAFile: pki.ca})
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, proxyToUpstream(t, db, fdb.TLSAddr, noCert).URI())
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.Database(db).Collection("items").InsertOne(octx, bson.D{{Key: "v", Value: 1}})
	if err == nil {
		t.Fatal("an upstream requiring a client certificate served a proxy without one")
	}
	assertPromptUnreachable(t, "proxy without a client certificate", err, time.Since(start))
}

// assertPromptUnreachable checks that a command through a proxy whose
// upstream drops it failed within 2 s with HostUnreachable (code 6).
func assertPromptUnreachable(t *testing.T, name string, err error, took time.Duration) {
	t.Helper()
	t.Logf("%s: %v (after %v)", name, err, took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Fatalf("%s: error after %v, want < 2s: %v", name, took, err)
	}
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(6) {
		t.Fatalf("%s: want HostUnreachable (code 6), got %v", name, err)
	}
}

// TestListenerMutualTLS: a listener that requires client certificates
// serves a driver presenting one signed by the CA, refuses drivers and raw
// TLS clients presenting none (or one from another CA), and keeps serving
// the good client throughout.
func TestListenerMutualTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	cfg, err := upstream.ServerTLS(upstream.TLSFiles{CertFile: pki.serverCert, KeyFile: pki.serverKey, CAFile: pki.ca}, "require")
	if err != nil {
		t.Fatal(err)
	}
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 100), edit: func(o *proxy.Options) { o.TLS = cfg }})
	ctx := ctxFor(t)
	good := connect(t, p.URI(), "tls=true", "tlsCAFile="+pki.ca, "tlsCertificateKeyFile="+pki.clientPEM)
	if err := writeAndRead(ctx, good, db, 100); err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}

	other := newTestPKI(t)
	for name, extra := range map[string][]string{
		"no certificate":              {"tls=true", "tlsCAFile=" + pki.ca},
		"a certificate of another CA": {"tls=true", "tlsCAFile=" + pki.ca, "tlsCertificateKeyFile=" + other.clientPEM},
		"plain TCP to a TLS listener": nil,
	} {
		c := connect(t, p.URI(), extra...)
		octx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := c.Ping(octx, nil)
		cancel()
		if err == nil {
			t.Fatalf("%s: served", name)
		}
		if err := writeAndRead(ctx, good, uniqueDB(t), 10); err != nil {
			t.Fatalf("good client after %s was refused: %v", name, err)
		}
	}
	// A raw TLS client without a certificate: the handshake fails.
	rawCfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}
	rawCfg.RootCAs = x509.NewCertPool()
	rawCfg.RootCAs.AddCert(pki.caCert)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", p.addr, rawCfg)
	if err == nil {
		// TLS 1.3: the server's refusal arrives with the first read.
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("raw TLS client without a certificate: %v, want a certificate error", err)
	}
}
