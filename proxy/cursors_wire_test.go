package proxy

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestConnForgetsEndedCursors: a connection forgets the cursors it read
// to their end, so a pooled connection that reads through many does not
// keep their ids (the registry is bounded; the connection's set was not).
func TestConnForgetsEndedCursors(t *testing.T) {
	s, addr := startWireProxy(t, wireRule, "", nil)
	c := dialWire(t, addr)
	insertThree(t, c)
	const rounds = 50
	for range rounds {
		r := c.cmd(bson.D{{Key: "find", Value: "readings"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "db"}})
		id := r.Lookup("cursor", "id").Int64()
		for id != 0 {
			r = c.cmd(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "readings"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "db"}})
			if v, ok := r.Lookup("ok").AsFloat64OK(); !ok || v != 1 {
				t.Fatalf("getMore: %s", r)
			}
			id = r.Lookup("cursor", "id").Int64()
		}
	}
	if n := s.OpenCursors(); n != 0 {
		t.Fatalf("registry holds %d cursors after all were exhausted", n)
	}
	s.mu.Lock()
	var held int
	for cn := range s.conns {
		held += cn.h.TrackedCursors() // read while the connection is idle, waiting for a request
	}
	s.mu.Unlock()
	if held > 0 {
		t.Fatalf("the connection still tracks %d cursor ids after %d cursors were exhausted (registry: 0)", held, rounds)
	}
}

// insertThree inserts three events of one series into db.readings.
func insertThree(t *testing.T, c *wireClient) {
	t.Helper()
	now := time.Now().Truncate(time.Second)
	docs := bson.A{}
	for i := range 3 {
		docs = append(docs, bson.D{{Key: "ts", Value: now.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: i}})
	}
	if r := c.cmd(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: docs}, {Key: "$db", Value: "db"}}); !bsonOK(r) {
		t.Fatalf("insert: %s", r)
	}
}

// TestGetMoreIDMustBeLong: a getMore whose id is a double or an int32 is
// refused as MongoDB refuses it (TypeMismatch), after the proxy's owner
// check: it reached the upstream unchecked.
func TestGetMoreIDMustBeLong(t *testing.T) {
	_, addr := startWireProxy(t, wireRule, "", nil)
	c := dialWire(t, addr)
	insertThree(t, c)
	r := c.cmd(bson.D{{Key: "find", Value: "readings"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "db"}})
	id := r.Lookup("cursor", "id").Int64()
	if id == 0 {
		t.Fatalf("no cursor: %s", r)
	}
	for _, v := range []any{float64(id), int32(id)} {
		r = c.cmd(bson.D{{Key: "getMore", Value: v}, {Key: "collection", Value: "readings"}, {Key: "$db", Value: "db"}})
		if code, _ := r.Lookup("code").AsInt64OK(); code != 14 {
			t.Fatalf("getMore of a %T id: %s, want TypeMismatch", v, r)
		}
	}
	// The cursor is still the client's to read.
	r = c.cmd(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "readings"}, {Key: "$db", Value: "db"}})
	if n, _ := r.Lookup("cursor", "nextBatch").Array().Values(); len(n) != 2 {
		t.Fatalf("getMore: %s", r)
	}
}
