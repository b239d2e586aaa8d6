package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

// Options configures a Dialer.
type Options struct {
	// URI is the upstream's mongodb:// URI.
	URI string
	// DialTimeout bounds connecting (and, for a replica set, finding the
	// primary); 5s when zero.
	DialTimeout time.Duration
	// TLS, when non-nil, wraps every upstream connection. When nil and the
	// URI says tls=true, a config is built from the URI's options.
	TLS *tls.Config
}

// Dialer opens upstream connections, one per client connection.
type Dialer struct {
	uri     *URI
	timeout time.Duration
	tls     *tls.Config

	mu          sync.Mutex
	primary     string    // replica sets: the last primary found
	primarySeen time.Time // when it was found
}

// primaryTTL is how long a found primary is trusted before it is looked up
// again. After a failover, connections dialed within it fail with
// NotWritablePrimary and the drivers retry on a new connection.
const primaryTTL = 10 * time.Second

// NewDialer checks opts and returns a Dialer.
func NewDialer(opts Options) (*Dialer, error) {
	u, err := ParseURI(opts.URI)
	if err != nil {
		return nil, err
	}
	d := &Dialer{uri: u, timeout: opts.DialTimeout, tls: opts.TLS}
	if d.timeout <= 0 {
		d.timeout = 5 * time.Second
	}
	if u.ConnectTimeout > 0 {
		d.timeout = u.ConnectTimeout
	}
	if d.tls == nil && u.TLS {
		cfg, err := ClientTLS(TLSFiles{CAFile: u.TLSCAFile, CertKeyFile: u.TLSCertKey, InsecureSkipVerify: u.TLSInsecure})
		if err != nil {
			return nil, err
		}
		d.tls = cfg
	}
	return d, nil
}

// Hosts are the upstream hosts from the URI.
func (d *Dialer) Hosts() []string { return d.uri.Hosts }

// Dial connects to the upstream: for a replica set, to its primary; for a
// list of routers or a single server, to the first that answers.
func (d *Dialer) Dial(ctx context.Context) (*Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if d.uri.ReplicaSet != "" {
		addr, err := d.findPrimary(ctx)
		if err != nil {
			return nil, err
		}
		c, err := d.dialAddr(ctx, addr)
		if err != nil {
			// The primary it knew may be down, another elected: ask
			// again now, not after primaryTTL (every dial failed until
			// then).
			d.forgetPrimary()
			if addr2, err2 := d.findPrimary(ctx); err2 == nil && addr2 != addr {
				return d.dialAddr(ctx, addr2)
			}
		}
		return c, err
	}
	var errs []error
	for i, h := range d.uri.Hosts {
		// Each host a share of what is left: one that accepts and never
		// answers took the whole timeout, and the hosts after it were
		// never really tried.
		hctx, hcancel := hostContext(ctx, len(d.uri.Hosts)-i)
		c, err := d.dialAddr(hctx, h)
		hcancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// hostContext is ctx bounded to a 1/left share of its remaining time
// (left hosts to try).
func hostContext(ctx context.Context, left int) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok || left <= 1 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(deadline)/time.Duration(left))
}

func (d *Dialer) dialAddr(ctx context.Context, addr string) (*Conn, error) {
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, Network(addr), addr)
	if err != nil {
		return nil, fmt.Errorf("upstream %s unreachable: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if d.tls != nil {
		cfg := d.tls.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("upstream %s: TLS handshake: %w", addr, err)
		}
		nc = tc
	}
	c := newConn(nc, addr)
	if err := c.checkLink(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// checkLink makes one round trip (ping) on a new connection. An upstream
// can accept the TCP connection (and even complete a TLS 1.3 handshake)
// and then drop it: plain TCP to a TLS port, or a TLS port that wants a
// client certificate the proxy does not send (TLS 1.3 reports that only
// on the first read). Found here, the client gets a prompt
// HostUnreachable naming the cause; found on the client's first command,
// its connection would be closed and its driver would wait out server
// selection. ping, not hello: a hello would spend the client's one chance
// to send its metadata. Any well-formed reply, even an error (ping before
// authentication on an upstream that requires it), shows the link works.
func (c *Conn) checkLink(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Command(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); err != nil {
		return fmt.Errorf("upstream %s accepted the connection, then failed the first command (TLS settings?): %w", c.addr, err)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("upstream %s: %w", c.addr, err)
	}
	return nil
}

// forgetPrimary drops the primary found, so the next findPrimary probes.
func (d *Dialer) forgetPrimary() {
	d.mu.Lock()
	d.primary = ""
	d.mu.Unlock()
}

// findPrimary returns the replica set's primary, probing the hosts on
// connections of its own: a hello on a client's connection would spend
// the client's one chance to send its metadata.
func (d *Dialer) findPrimary(ctx context.Context) (string, error) {
	d.mu.Lock()
	if d.primary != "" && time.Since(d.primarySeen) < primaryTTL {
		p := d.primary
		d.mu.Unlock()
		return p, nil
	}
	d.mu.Unlock()
	var errs []error
	for i, h := range d.uri.Hosts {
		hctx, hcancel := hostContext(ctx, len(d.uri.Hosts)-i)
		primary, err := d.probe(hctx, h)
		hcancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if primary == "" {
			continue
		}
		d.mu.Lock()
		d.primary, d.primarySeen = primary, time.Now()
		d.mu.Unlock()
		return primary, nil
	}
	errs = append(errs, fmt.Errorf("no primary of replica set %q among %v", d.uri.ReplicaSet, d.uri.Hosts))
	return "", errors.Join(errs...)
}

// probe asks host who the primary is: itself if writable, else the
// primary it names ("" when it knows none).
func (d *Dialer) probe(ctx context.Context, host string) (string, error) {
	c, err := d.dialAddr(ctx, host)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	reply, err := c.Command(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		return "", err
	}
	if w, ok := reply.Lookup("isWritablePrimary").BooleanOK(); ok && w {
		return host, nil
	}
	if p, ok := reply.Lookup("primary").StringValueOK(); ok {
		return p, nil
	}
	return "", nil
}

// Command runs one command the proxy itself builds (not a client's) and
// returns its reply body. The reply aliases the connection's buffer.
func (c *Conn) Command(cmd any) (bson.Raw, error) {
	body, err := bson.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: encode command: %w", c.addr, err)
	}
	frame := wire.AppendMsg(nil, NextRequestID(), 0, 0, body)
	_, rf, err := c.RoundTrip(frame)
	if err != nil {
		return nil, err
	}
	var m wire.Msg
	if err := m.Decode(rf); err != nil {
		return nil, fmt.Errorf("upstream %s: reply: %w", c.addr, err)
	}
	return bson.Raw(m.Body), nil
}
