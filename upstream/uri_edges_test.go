package upstream

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestParseURIQuestionMarkInPassword: the driver (and so the config
// check) takes "mongodb://u:pa?ss@h:1/?tls=true" as host h:1 with TLS;
// ParseURI cuts the authority at the '?' of the password, dials "u:pa"
// (the password in every dial error) and drops tls=true.
func TestParseURIQuestionMarkInPassword(t *testing.T) {
	u, err := ParseURI("mongodb://u:pa?ss@h:1/?tls=true")
	if err != nil {
		if strings.Contains(err.Error(), "pa?ss") {
			t.Fatalf("error shows the password: %v", err)
		}
		return // a clear refusal is fine too
	}
	if !slices.Equal(u.Hosts, []string{"h:1"}) || !u.TLS {
		t.Errorf("hosts %q, tls %v; want [h:1], true", u.Hosts, u.TLS)
	}
}

// TestParseURITLSFileImpliesTLS: the driver turns TLS on for
// tlsCAFile and tlsCertificateKeyFile; ParseURI keeps them and dials
// plain TCP.
func TestParseURITLSFileImpliesTLS(t *testing.T) {
	for _, uri := range []string{
		"mongodb://h/?tlsCAFile=/etc/ssl/ca.pem",
		"mongodb://h/?tlsCertificateKeyFile=/etc/ssl/client.pem",
	} {
		u, err := ParseURI(uri)
		if err != nil {
			continue // a clear refusal is fine too
		}
		if !u.TLS {
			t.Errorf("%s: TLS off: the proxy would dial the upstream in plain text", uri)
		}
	}
}

// TestParseURIIPv6Zone: an IPv6 literal's zone is written %25 in a
// connection string; ParseURI keeps the escape, so the zone dialled is
// "25eth0".
func TestParseURIIPv6Zone(t *testing.T) {
	u, err := ParseURI("mongodb://[fe80::1%25eth0]:27017/")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"[fe80::1%eth0]:27017"}; !slices.Equal(u.Hosts, want) {
		t.Errorf("hosts %q, want %q", u.Hosts, want)
	}
}

// TestEmbeddedDataDirURLChars: the data dir is pasted into FerretDB's
// "file:" URL unescaped: a '#' or '?' in its path makes FerretDB refuse it
// with a message about a URL path, and a %XX in it is decoded, so the
// SQLite files go to another folder (here "aAb" instead of "a%41b").
func TestEmbeddedDataDirURLChars(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Run("hash", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data#1")
		e, err := StartEmbedded(EmbeddedOptions{DataDir: dir, Logger: quiet})
		if err != nil {
			t.Fatalf("data dir %q: %v", dir, err)
		}
		e.Close()
	})
	t.Run("percent", func(t *testing.T) {
		parent := t.TempDir()
		dir, other := filepath.Join(parent, "a%41b"), filepath.Join(parent, "aAb")
		if err := os.Mkdir(other, 0o750); err != nil {
			t.Fatal(err)
		}
		e, err := StartEmbedded(EmbeddedOptions{DataDir: dir, Logger: quiet})
		if err == nil {
			e.Close()
			t.Fatalf("data dir %q: started", dir)
		}
		if !strings.Contains(err.Error(), "a % in its path") {
			t.Fatalf("data dir %q: %v, want the %% named", dir, err)
		}
		if ents, _ := os.ReadDir(other); len(ents) > 0 {
			t.Fatalf("wrote into %s", other)
		}
	})
}
