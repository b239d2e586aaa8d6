package backend

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// HAProxy is a TCP load balancer (Debian's haproxy) in front of several
// proxies on loopback: what a fleet of tsproxy instances sits behind. It
// balances connections round robin and checks each backend every 200 ms,
// so a dead one is out of rotation within about half a second.
type HAProxy struct {
	// Addr is the balancer's own address, for clients.
	Addr string
	dir  string
	p    *proc
}

// HAProxyBinary is the haproxy command, or an error saying how to get it.
func HAProxyBinary() (string, error) {
	for _, p := range []string{"haproxy", "/usr/sbin/haproxy"} {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", errors.New("haproxy not found: apt-get install haproxy (.ci/run installs it)")
}

// StartHAProxy starts haproxy on a free loopback port, balancing over
// backends (host:port each).
func StartHAProxy(backends []string) (*HAProxy, error) {
	bin, err := HAProxyBinary()
	if err != nil {
		return nil, err
	}
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tsproxy-haproxy-")
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(addr, backends)), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-db", "-f", cfg) // -db: foreground, logs to stderr
	p, err := startProc(cmd, syscall.SIGKILL)
	if err != nil {
		return nil, fmt.Errorf("start haproxy: %w", err)
	}
	h := &HAProxy{Addr: addr, dir: dir, p: p}
	if err := p.waitListen(addr, 10*time.Second); err != nil {
		h.Close()
		return nil, fmt.Errorf("haproxy: %w\n%s", err, p.output())
	}
	return h, nil
}

// haproxyConfig is the configuration of a TCP balancer on addr.
func haproxyConfig(addr string, backends []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    maxconn 4096

defaults
    mode tcp
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    # A client whose backend died is disconnected (its driver reconnects
    # through the balancer to a living one).
    option redispatch
    retries 2

frontend fleet
    bind %s
    default_backend proxies

backend proxies
    balance roundrobin
`, addr)
	for i, be := range backends {
		fmt.Fprintf(&b, "    server proxy%d %s check inter 200ms fall 2 rise 1 on-marked-down shutdown-sessions\n", i+1, be)
	}
	return b.String()
}

// URI is the balancer's mongodb:// URI in load-balanced mode.
func (h *HAProxy) URI() string { return "mongodb://" + h.Addr + "/?loadBalanced=true" }

// Output is haproxy's latest output, for a failing test.
func (h *HAProxy) Output() string { return h.p.output() }

// Close stops haproxy and removes its folder.
func (h *HAProxy) Close() {
	if h.p != nil {
		h.p.stop(syscall.SIGTERM, 5*time.Second)
	}
	_ = os.RemoveAll(h.dir)
}
