package upstream

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// URI is the part of a mongodb:// connection string the proxy acts on.
// Credentials in it are not used for client connections: each client
// authenticates itself, through the proxy, with its own credentials.
type URI struct {
	Hosts          []string // host:port, port 27017 when omitted; or a Unix socket's path (IsSocket)
	ReplicaSet     string
	TLS            bool
	TLSCAFile      string
	TLSCertKey     string // tlsCertificateKeyFile: PEM with certificate and key
	TLSInsecure    bool
	ConnectTimeout time.Duration
}

// ParseURI parses a mongodb:// URI. mongodb+srv:// needs DNS SRV lookups
// the proxy does not do; it is refused with a message saying so.
func ParseURI(s string) (*URI, error) {
	const scheme = "mongodb://"
	if strings.HasPrefix(s, "mongodb+srv://") {
		return nil, fmt.Errorf("upstream URI %q: mongodb+srv:// is not supported; list the hosts with mongodb://", redact(s))
	}
	if !strings.HasPrefix(s, scheme) {
		return nil, fmt.Errorf("upstream URI %q: must start with mongodb://", redact(s))
	}
	rest := s[len(scheme):]
	// The user info ends at the first "@", as the driver reads it (a
	// password may hold "?"); the proxy takes no credentials from it.
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	hostPart, query := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		hostPart = rest[:i]
		tail := rest[i:]
		if j := strings.IndexByte(tail, '?'); j >= 0 {
			query = tail[j+1:]
		}
	}
	if hostPart == "" {
		return nil, fmt.Errorf("upstream URI %q: no host", redact(s))
	}
	u := &URI{}
	for _, h := range strings.Split(hostPart, ",") {
		if h == "" {
			return nil, fmt.Errorf("upstream URI %q: empty host in list", redact(s))
		}
		if path, ok := socketPath(h); ok {
			u.Hosts = append(u.Hosts, path)
			continue
		}
		// Percent-encoded, as the spec has it: an IPv6 zone is "%25eth0".
		h, err := url.PathUnescape(h)
		if err != nil {
			return nil, fmt.Errorf("upstream URI %q: host: %w", redact(s), err)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "27017")
		}
		u.Hosts = append(u.Hosts, h)
	}
	tlsSaid := false
	vals, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("upstream URI %q: options: %w", redact(s), err)
	}
	for k, vs := range vals {
		v := vs[len(vs)-1]
		switch strings.ToLower(k) {
		case "replicaset":
			u.ReplicaSet = v
		case "tls", "ssl":
			u.TLS = v == "true"
			tlsSaid = true
		case "tlscafile":
			u.TLSCAFile = v
		case "tlscertificatekeyfile":
			u.TLSCertKey = v
		case "tlsinsecure", "tlsallowinvalidcertificates":
			u.TLSInsecure = v == "true"
		case "connecttimeoutms":
			ms, err := strconv.Atoi(v)
			if err != nil || ms < 0 {
				return nil, fmt.Errorf("upstream URI %q: connectTimeoutMS %q is not a number of milliseconds", redact(s), v)
			}
			u.ConnectTimeout = time.Duration(ms) * time.Millisecond
		}
		// Other options (authSource, appName, w, ...) concern the clients,
		// which send their own; the proxy does not act on them.
	}
	// A CA or certificate file turns TLS on, as the driver reads it: the
	// proxy dialed such an upstream in plain text.
	if (u.TLSCAFile != "" || u.TLSCertKey != "") && !u.TLS {
		if tlsSaid {
			return nil, fmt.Errorf("upstream URI %q: tls=false with a TLS file (tlsCAFile or tlsCertificateKeyFile)", redact(s))
		}
		u.TLS = true
	}
	return u, nil
}

// socketPath reads a host of a connection string that names a Unix
// domain socket: its percent-encoded path, ending in ".sock", as the
// connection string specification has it (mongodb://%2Ftmp%2Fx.sock/).
func socketPath(host string) (string, bool) {
	path, err := url.PathUnescape(host)
	if err != nil || !IsSocket(path) {
		return "", false
	}
	return path, true
}

// IsSocket says whether a host of URI.Hosts is a Unix domain socket's path.
func IsSocket(host string) bool {
	return strings.HasPrefix(host, "/") && strings.HasSuffix(host, ".sock")
}

// Network is the network to dial a host of URI.Hosts on: "unix" for a
// socket's path, else "tcp".
func Network(host string) string {
	if IsSocket(host) {
		return "unix"
	}
	return "tcp"
}

// SocketURI is the mongodb:// URI of the server listening on the Unix
// domain socket at path.
func SocketURI(path string) string {
	return "mongodb://" + url.PathEscape(path) + "/"
}

// redact hides a password in a URI so it never reaches a log or an error.
func redact(s string) string {
	at := strings.LastIndexByte(s, '@')
	start := strings.Index(s, "://")
	if at < 0 || start < 0 || at < start {
		return s
	}
	return s[:start+3] + "***@" + s[at+1:]
}
