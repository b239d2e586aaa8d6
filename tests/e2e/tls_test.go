package e2e

import (
	"context"
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

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/upstream"
)

// testCA writes a CA and a server certificate for 127.0.0.1 under dir and
// returns the paths of the CA, the server certificate and its key.
func testCA(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tsproxy test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", der), write("server.key", "EC PRIVATE KEY", keyDER)
}

// TestListenerTLS: a proxy with listener TLS serves a driver that trusts
// its CA, and a plain-TCP client gets nothing from it.
func TestListenerTLS(t *testing.T) {
	t.Parallel()
	caFile, certFile, keyFile := testCA(t, t.TempDir())
	cfg, err := upstream.ServerTLS(upstream.TLSFiles{CertFile: certFile, KeyFile: keyFile}, "none")
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, proxyOptions{edit: func(o *proxy.Options) { o.TLS = cfg }})
	ctx := ctxFor(t)
	db := uniqueDB(t)
	c := connect(t, p.URI(), "tls=true", "tlsCAFile="+caFile)
	coll := c.Database(db).Collection("items")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "a"}, {Key: "v", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	var got bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Decode(&got); err != nil || got["v"] != int32(1) {
		t.Fatalf("find over TLS: %v %v", got, err)
	}
	// A client without TLS is not served.
	plain := connect(t, p.URI())
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := plain.Ping(pctx, nil); err == nil {
		t.Fatal("a plain-TCP client was served by a TLS listener")
	}
}
