package main

import (
	"crypto/tls"

	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

func upstreamTLS(u rules.Upstream) (*tls.Config, error) {
	if !u.TLS.Enabled {
		return nil, nil // the URI's own tls=true options still apply
	}
	return upstream.ClientTLS(upstream.TLSFiles{
		CAFile: u.TLS.CAFile, CertFile: u.TLS.CertFile, KeyFile: u.TLS.KeyFile,
		ServerName: u.TLS.ServerName, InsecureSkipVerify: u.TLS.InsecureSkipVerify,
	})
}

func listenerTLS(t rules.TLSServer) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	return upstream.ServerTLS(upstream.TLSFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}, t.ClientAuth)
}
