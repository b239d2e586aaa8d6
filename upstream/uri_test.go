package upstream

import (
	"slices"
	"strings"
	"testing"
)

func TestParseURIHosts(t *testing.T) {
	for _, tc := range []struct {
		uri   string
		hosts []string
	}{
		{"mongodb://h/", []string{"h:27017"}},
		{"mongodb://h:1,[::1]/?replicaSet=rs", []string{"h:1", "[::1]:27017"}},
		{"mongodb://u:p@h:2/db", []string{"h:2"}},
		// A Unix socket: its path percent-encoded, ending in .sock.
		{"mongodb://%2Ftmp%2Fferretdb.sock/", []string{"/tmp/ferretdb.sock"}},
		{"mongodb://%2Ftmp%2Fa%20b%2Fx.sock,h:3/", []string{"/tmp/a b/x.sock", "h:3"}},
		// Not a socket: no leading slash, or no .sock.
		{"mongodb://x.sock/", []string{"x.sock:27017"}},
	} {
		u, err := ParseURI(tc.uri)
		if err != nil {
			t.Errorf("%s: %v", tc.uri, err)
			continue
		}
		if !slices.Equal(u.Hosts, tc.hosts) {
			t.Errorf("%s: hosts %q, want %q", tc.uri, u.Hosts, tc.hosts)
		}
	}
}

func TestSocketURIRoundTrip(t *testing.T) {
	for _, path := range []string{"/tmp/ferretdb.sock", "/var/run/a b/f%.sock"} {
		uri := SocketURI(path)
		if strings.Count(uri, "/") != 3 { // mongodb:// and the trailing one: the path's own slashes are escaped
			t.Errorf("SocketURI(%q) = %q: path not escaped", path, uri)
		}
		u, err := ParseURI(uri)
		if err != nil {
			t.Fatalf("%s: %v", uri, err)
		}
		if len(u.Hosts) != 1 || u.Hosts[0] != path || !IsSocket(u.Hosts[0]) {
			t.Errorf("%s: hosts %q, want [%q]", uri, u.Hosts, path)
		}
	}
}
