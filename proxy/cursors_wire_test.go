package proxy

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A connection's set of owned cursors must not keep the ids of cursors
// that are gone (exhausted, killed): a long-lived connection that reads
// with cursors would otherwise grow it without bound.
// TestConnForgetsEndedCursors: a connection forgets the cursors it read
// to their end, so a pooled connection that reads through many does not
// keep their ids (the registry is bounded; the connection's set was not).
func TestConnForgetsEndedCursors(t *testing.T) {
	s, addr := startWireProxy(t, wireRule, "", nil)
	c := dialWire(t, addr)
	now := time.Now().Truncate(time.Second)
	docs := bson.A{}
	for i := range 3 {
		docs = append(docs, bson.D{{Key: "ts", Value: now.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: i}})
	}
	c.cmd(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: docs}, {Key: "$db", Value: "db"}})
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
		held += len(cn.cursors) // read while the connection is idle, waiting for a request
	}
	s.mu.Unlock()
	if held > 0 {
		t.Fatalf("the connection still tracks %d cursor ids after %d cursors were exhausted (registry: 0)", held, rounds)
	}
}
