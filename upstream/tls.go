package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSFiles names the PEM files of a TLS configuration.
type TLSFiles struct {
	CAFile             string // roots to verify the peer; system roots when empty
	CertFile           string // own certificate (may also hold the key)
	KeyFile            string // own key; CertFile when empty
	CertKeyFile        string // certificate and key in one file (MongoDB's tlsCertificateKeyFile)
	ServerName         string
	InsecureSkipVerify bool
}

// ClientTLS builds the TLS config the proxy uses toward the upstream.
func ClientTLS(f TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName, InsecureSkipVerify: f.InsecureSkipVerify} //nolint:gosec // opt-in by the user
	if f.CAFile != "" {
		pool, err := loadPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	cert, ok, err := loadCert(f)
	if err != nil {
		return nil, err
	}
	if ok {
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// ServerTLS builds the TLS config of the proxy's client listener.
// clientAuth is "none", "request" or "require" (verified against CAFile).
func ServerTLS(f TLSFiles, clientAuth string) (*tls.Config, error) {
	cert, ok, err := loadCert(f)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("listener TLS: certFile is required")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.CAFile != "" {
		pool, err := loadPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
	}
	switch clientAuth {
	case "", "none":
	case "request":
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	case "require":
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	default:
		return nil, fmt.Errorf("listener TLS: clientAuth %q: want none, request or require", clientAuth)
	}
	return cfg, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("TLS CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA file %s: no PEM certificate in it", file)
	}
	return pool, nil
}

func loadCert(f TLSFiles) (tls.Certificate, bool, error) {
	certFile, keyFile := f.CertFile, f.KeyFile
	if f.CertKeyFile != "" {
		certFile, keyFile = f.CertKeyFile, f.CertKeyFile
	}
	if certFile == "" {
		return tls.Certificate{}, false, nil
	}
	if keyFile == "" {
		keyFile = certFile
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, false, fmt.Errorf("TLS certificate %s: %w", certFile, err)
	}
	return cert, true, nil
}
