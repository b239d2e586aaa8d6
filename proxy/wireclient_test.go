package proxy

// A proxy over the embedded upstream, driven frame by frame: for what a
// driver never sends (moreToCome on any command, a request while the
// proxy dials).

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// startWireProxy starts an embedded upstream and a proxy with the yaml config
// against it (or against upURI when not empty); it returns the proxy address.
func startWireProxy(t *testing.T, yaml string, upURI string, edit func(*Options)) (*Server, string) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("RV_DEBUG") != "" {
		quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if upURI == "" {
		e, err := upstream.StartEmbedded(upstream.EmbeddedOptions{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		upURI = e.LocalURI()
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.1:0\ntelemetry:\n  metricsListen: \"\"\n"+yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.Load(rules.LoadOptions{ConfigFile: file, Flags: pflag.NewFlagSet("none", pflag.ContinueOnError)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := upstream.NewDialer(upstream.Options{URI: upURI, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Dialer: d, Rules: cfg.RuleSet(), Logger: quiet}
	if edit != nil {
		edit(&opts)
	}
	return serveProxy(t, opts)
}

const wireRule = `rules:
  - namespace: db.readings
    timeField: ts
    metaField: sensor
    bucket:
      span: 1h
`

// wireClient is a raw wire client.
type wireClient struct {
	t   *testing.T
	nc  net.Conn
	r   *bufio.Reader
	req int32
}

func dialWire(t *testing.T, addr string) *wireClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &wireClient{t: t, nc: nc, r: bufio.NewReader(nc)}
}

func (c *wireClient) send(flags wire.MsgFlags, cmd bson.D) int32 {
	c.t.Helper()
	body, err := bson.Marshal(cmd)
	if err != nil {
		c.t.Fatal(err)
	}
	c.req++
	if _, err := c.nc.Write(wire.AppendMsg(nil, c.req, 0, flags, body)); err != nil {
		c.t.Fatal(err)
	}
	return c.req
}

func (c *wireClient) sendRaw(frame []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(frame); err != nil {
		c.t.Fatal(err)
	}
}

// read reads one reply; ok false on a read error.
func (c *wireClient) read(timeout time.Duration) (wire.Header, bson.Raw, error) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	h, frame, err := wire.ReadMessage(c.r, nil, 0)
	if err != nil {
		return h, nil, err
	}
	if h.OpCode == wire.OpCompressed {
		if frame, err = wire.Decompress(frame); err != nil {
			return h, nil, err
		}
		h, _ = wire.ParseHeader(frame)
	}
	if h.OpCode == wire.OpReply {
		var r wire.Reply
		if err := r.Decode(frame); err != nil {
			return h, nil, err
		}
		return h, bson.Raw(r.Documents[0]), nil
	}
	var m wire.Msg
	if err := m.Decode(frame); err != nil {
		return h, nil, err
	}
	return h, bson.Raw(append([]byte(nil), m.Body...)), nil
}

func (c *wireClient) cmd(cmd bson.D) bson.Raw {
	c.t.Helper()
	id := c.send(0, cmd)
	h, body, err := c.read(20 * time.Second)
	if err != nil {
		c.t.Fatalf("%v: %v", cmd[0].Key, err)
	}
	if h.ResponseTo != id {
		c.t.Fatalf("%v: reply responseTo %d, want %d (body %s)", cmd[0].Key, h.ResponseTo, id, body)
	}
	return body
}
