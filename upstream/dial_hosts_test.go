package upstream

import (
	"bufio"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

// fakeMember is a wire server answering ping {ok:1} and hello with
// isWritablePrimary = *primary (and primary: *names).
type fakeMember struct {
	ln      net.Listener
	primary atomic.Bool
	name    atomic.Value // string: the primary it names when not primary
	stall   bool         // accept, never answer
}

func startMember(t *testing.T, stall bool) *fakeMember {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &fakeMember{ln: ln, stall: stall}
	m.name.Store("")
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				r := bufio.NewReader(nc)
				for {
					h, frame, err := wire.ReadMessage(r, nil, 0)
					if err != nil {
						return
					}
					if m.stall {
						continue
					}
					var msg wire.Msg
					_ = msg.Decode(frame)
					reply := bson.D{{Key: "ok", Value: 1.0}}
					if msg.CommandName() == "hello" {
						reply = bson.D{{Key: "isWritablePrimary", Value: m.primary.Load()}, {Key: "setName", Value: "rs"}}
						if p := m.name.Load().(string); p != "" {
							reply = append(reply, bson.E{Key: "primary", Value: p})
						}
						reply = append(reply, bson.E{Key: "ok", Value: 1.0})
					}
					body, _ := bson.Marshal(reply)
					if _, err := nc.Write(wire.AppendMsg(nil, h.RequestID+1, h.RequestID, 0, body)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return m
}

func (m *fakeMember) addr() string { return m.ln.Addr().String() }

// TestDialSkipsHungFirstHost: with two routers in the URI, the first
// accepting connections but never answering (a hung mongos), the dial
// spends the whole timeout on it and never tries the second, healthy one.
func TestDialSkipsHungFirstHost(t *testing.T) {
	hung := startMember(t, true)
	good := startMember(t, false)
	d, err := NewDialer(Options{URI: "mongodb://" + hung.addr() + "," + good.addr() + "/", DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Dial(context.Background())
	if err != nil {
		t.Fatalf("dial with a healthy second host failed: %v", err)
	}
	c.Close()
}

// TestReplicaSetFailover: after a failover, the cached primary (now
// down) is dialled for primaryTTL, though another member is primary.
func TestReplicaSetFailover(t *testing.T) {
	a := startMember(t, false)
	b := startMember(t, false)
	a.primary.Store(true)
	d, err := NewDialer(Options{URI: "mongodb://" + a.addr() + "," + b.addr() + "/?replicaSet=rs", DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	// a dies; b is elected.
	a.ln.Close()
	b.primary.Store(true)
	c, err = d.Dial(context.Background())
	if err != nil {
		t.Fatalf("dial after the failover: %v", err)
	}
	if c.Addr() != b.addr() {
		t.Fatalf("dialled %s, want the new primary %s", c.Addr(), b.addr())
	}
	c.Close()
}
