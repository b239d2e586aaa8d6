package proxy

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/wire"
)

// A request with moreToCome gets no reply: the next reply the client reads
// must answer its next request.
// TestMoreToComeGetsNoReply: no handler answers a moreToCome request; a
// reply would be read as the answer to the client's next request.
func TestMoreToComeGetsNoReply(t *testing.T) {
	_, addr := startWireProxy(t, wireRule, "", nil)
	cases := []struct {
		name string
		cmd  bson.D
	}{
		{"getMore of an unknown cursor", bson.D{{Key: "getMore", Value: int64(1<<62 | 5)}, {Key: "collection", Value: "readings"}, {Key: "$db", Value: "db"}}},
		{"killCursors", bson.D{{Key: "killCursors", Value: "readings"}, {Key: "cursors", Value: bson.A{int64(1<<62 | 7)}}, {Key: "$db", Value: "db"}}},
		{"collMod of a config rule", bson.D{{Key: "collMod", Value: "readings"}, {Key: "$db", Value: "db"}}},
		{"create timeseries", bson.D{{Key: "create", Value: "ts2"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "t"}}}, {Key: "$db", Value: "db"}}},
		{"hello", bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}},
		{"tsproxyFlush", bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialWire(t, addr)
			c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
			c.send(wire.MoreToCome, tc.cmd)
			ping := c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
			h, body, err := c.read(20 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if h.ResponseTo != ping {
				t.Fatalf("the reply after a moreToCome %s answers request %d, not the ping %d: %s", tc.name, h.ResponseTo, ping, body)
			}
		})
	}
}
