package fuzz

import (
	"bytes"
	"testing"

	"github.com/tsproxy/tsproxy/wire"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/hello"

	"github.com/tsproxy/tsproxy/rewrite/insert"

	"github.com/tsproxy/tsproxy/rewrite/read"

	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/query"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// fuzzCaps are the upstreams the read path distinguishes: FerretDB as
// detected from its buildInfo (packed events: every read is the proxy's
// scan), FerretDB reading unwound events (buckets of arrays: the aggregate
// path whose batches the proxy maps, with meta lookups), and MongoDB.
var fuzzCaps = []caps.Upstream{ferretCaps, unwoundFerretCaps(), rwtest.MongoCaps}

var ferretCaps = caps.Detect(bsoncore.NewDocumentBuilder().AppendString("ferretdbVersion", "v1.24.0").Build())

func unwoundFerretCaps() caps.Upstream {
	c := ferretCaps
	c.PackedEvents = false
	return c
}

// FuzzReadReply: a read command (find, aggregate, count, distinct, explain)
// and an upstream reply, both arbitrary. Planning and mapping the reply
// back never panic, and everything sent upstream or to the client is valid
// BSON.
func FuzzReadReply(f *testing.F) {
	bodies := recordedBodies(f)
	replies := [][]byte{
		marshalSeed(f, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{bson.Raw(rwtest.Unwound(f, "s1", D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(5)}, {Key: "sensorId", Value: nil}}))}}, {Key: "id", Value: int64(7)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}}),
		marshalSeed(f, D{{Key: "cursor", Value: D{{Key: "nextBatch", Value: A{D{{Key: "n", Value: 3}}}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}}),
		marshalSeed(f, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "x"}, {Key: "code", Value: 2}}),
	}
	for _, b := range bodies {
		for _, r := range replies {
			f.Add(b, r)
		}
	}
	f.Add(marshalSeed(f, D{{Key: "count", Value: "readings"}, {Key: "query", Value: D{{Key: "sensorId", Value: "a"}}}, {Key: "$db", Value: "iot"}}), replies[0])
	f.Add(marshalSeed(f, D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "v"}, {Key: "$db", Value: "iot"}}), replies[0])
	f.Add(marshalSeed(f, D{{Key: "explain", Value: D{{Key: "find", Value: "readings"}}}, {Key: "$db", Value: "iot"}}), replies[2])
	f.Add(marshalSeed(f, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}}}, {Key: "cursor", Value: D{}}, {Key: "$db", Value: "iot"}}), replies[1])
	f.Fuzz(func(t *testing.T, body, reply []byte) {
		// The proxy hands the rewrite only documents wire has validated.
		if wire.ValidateDocument(body) != nil || wire.ValidateDocument(reply) != nil {
			return
		}
		for _, caps := range fuzzCaps {
			p, err := read.PlanRead(body, rwtest.Rule(), read.Options{Caps: caps})
			if err != nil {
				mustValid(t, "error reply", mongoerr.Reply(err))
				continue
			}
			mustValid(t, "command", p.Command)
			mustValid(t, "meta prefetch", p.MetaPrefetch())
			mustValid(t, "prefetch getMore", p.AddPrefetched(reply))
			for _, q := range p.MetaQuery(reply) {
				mustValid(t, "meta query", q)
			}
			_ = p.AddMetas(reply)
			switch {
			case p.Drain:
				mustValid(t, "drain getMore", p.Feed(reply))
				mustValid(t, "drain result", p.Result())
			case p.Cursor != nil:
				out, _, err := p.Cursor.MapReply(reply)
				if err != nil {
					mustValid(t, "error reply", mongoerr.Reply(err))
					continue
				}
				mustValid(t, "mapped reply", out)
			}
		}
	})
}

// FuzzAdminRewrite: every other rewritten command (getMore, killCursors,
// listCollections, collStats, drop, hello, insert's key extraction) with
// an arbitrary body and upstream reply: no panic, valid BSON out.
func FuzzAdminRewrite(f *testing.F) {
	for _, b := range recordedBodies(f) {
		f.Add(b, b)
	}
	lc := marshalSeed(f, D{{Key: "cursor", Value: D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.$cmd.listCollections"}, {Key: "firstBatch", Value: A{
		D{{Key: "name", Value: "readings.buckets"}, {Key: "type", Value: "collection"}}, D{{Key: "name", Value: "other"}}}}}}, {Key: "ok", Value: 1.0}})
	f.Add(marshalSeed(f, D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: D{{Key: "name", Value: D{{Key: "$in", Value: A{"readings", "x"}}}}}}, {Key: "$db", Value: "iot"}}), lc)
	f.Add(marshalSeed(f, D{{Key: "getMore", Value: int64(5)}, {Key: "collection", Value: "readings"}, {Key: "$db", Value: "iot"}}), lc)
	f.Add(marshalSeed(f, D{{Key: "killCursors", Value: "readings"}, {Key: "cursors", Value: A{int64(5), int32(6)}}, {Key: "$db", Value: "iot"}}), lc)
	f.Add(marshalSeed(f, D{{Key: "collStats", Value: "readings"}, {Key: "scale", Value: 1}, {Key: "$db", Value: "iot"}}),
		marshalSeed(f, D{{Key: "ns", Value: "iot.readings.buckets"}, {Key: "count", Value: 3}, {Key: "cursor", Value: D{{Key: "firstBatch", Value: A{D{{Key: "n", Value: 9}}}}}}, {Key: "ok", Value: 1.0}}))
	f.Add(marshalSeed(f, D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: A{D{{Key: "$collStats", Value: D{{Key: "storageStats", Value: D{}}}}},
		D{{Key: "$group", Value: D{{Key: "_id", Value: nil}, {Key: "v", Value: D{{Key: "$sum", Value: "$storageStats.size"}}}}}}}}, {Key: "cursor", Value: D{}}, {Key: "$db", Value: "iot"}}),
		marshalSeed(f, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{D{{Key: "ns", Value: "iot.readings.buckets"}, {Key: "storageStats", Value: D{{Key: "count", Value: 3}}}, {Key: "count", Value: 3}}}},
			{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}}))
	f.Add(marshalSeed(f, D{{Key: "hello", Value: 1}, {Key: "compression", Value: A{"zstd", "snappy"}}, {Key: "$db", Value: "admin"}}),
		marshalSeed(f, D{{Key: "isWritablePrimary", Value: true}, {Key: "hosts", Value: A{"a:1"}}, {Key: "setName", Value: "rs"}, {Key: "maxWireVersion", Value: 21}, {Key: "ok", Value: 1.0}}))
	f.Fuzz(func(t *testing.T, body, reply []byte) {
		// The proxy hands the rewrite only documents wire has validated.
		if wire.ValidateDocument(body) != nil || wire.ValidateDocument(reply) != nil {
			return
		}
		r := rwtest.Rule()
		if out, err := query.GetMore(body, r); err == nil {
			mustValid(t, "getMore", out)
		}
		if out, _, err := query.KillCursors(body, r); err == nil {
			mustValid(t, "killCursors", out)
		}
		if lp, err := admin.PlanListCollections(body, "iot", []*rules.Rule{r, rwtest.InsertRule()}); err == nil {
			mustValid(t, "listCollections", lp.Command)
			mustValid(t, "listCollections getMore", lp.Feed(reply))
			mustValid(t, "listCollections result", lp.Result())
		} else {
			mustValid(t, "error reply", mongoerr.Reply(err))
		}
		if cs, err := admin.PlanCollStats(body, r); err == nil {
			mustValid(t, "collStats", cs.Stats)
			mustValid(t, "collStats count", cs.Count)
			mustValid(t, "collStats count fallback", cs.CountFallback)
			n, _ := cs.CountFrom(reply)
			if bsoncore.Document(reply).Validate() == nil {
				mustValid(t, "collStats reply", cs.Reply(reply, n))
			}
		}
		if out, err := admin.PlanDrop(body, r); err == nil {
			mustValid(t, "drop", out)
		}
		if bsoncore.Document(reply).Validate() == nil {
			mustValid(t, "drop reply", admin.DropReply(reply, r))
		}
		if hs, err := hello.Request(body); err == nil {
			mustValid(t, "hello", hs.Body)
		}
		if out, err := hello.Reply(reply, hello.ReplyOptions{Compressor: "zstd"}); err == nil {
			mustValid(t, "hello reply", out)
			if _, err := bsoncore.Document(out).LookupErr("hosts"); err == nil {
				t.Fatal("hello reply keeps the upstream's hosts")
			}
		}
		_ = caps.Detect(reply)
		if keys, err := insert.Keys(rewrite.Command{Body: body}, rwtest.InsertRule()); err == nil {
			for _, k := range keys {
				_ = k.ID("iot.readings.buckets", 0)
			}
		}
	})
}

// FuzzInsertReadRoundTrip: an arbitrary event, inserted k times (k = 1..4,
// so both the upsert and the complete-bucket path run) and read back with
// find {} from buckets built from exactly what the insert sent upstream,
// comes back byte for byte as the app sent it (with the _id the proxy
// gave it first when it had none), on both FerretDB's and MongoDB's read
// path.
func FuzzInsertReadRoundTrip(f *testing.F) {
	f.Add(marshalSeed(f, rwtest.Event(rwtest.OID(9), rwtest.DT(5), "s", int32(1))), uint8(0))
	f.Add(marshalSeed(f, rwtest.Event(nil, rwtest.DT(-rwtest.Hour), D{{Key: "a", Value: 1}}, 2.5)), uint8(2))
	f.Add(marshalSeed(f, D{{Key: "value", Value: int64(3)}, {Key: "ts", Value: rwtest.DT(7)}, {Key: "x", Value: A{1, D{{Key: "y", Value: nil}}}}}), uint8(3))
	f.Add(marshalSeed(f, D{{Key: "sensorId", Value: nil}, {Key: "_id", Value: "k"}, {Key: "ts", Value: rwtest.DT(1 << 40)}}), uint8(1))
	for _, b := range recordedBodies(f) {
		// Recorded inserts carry their events under "documents".
		if v, err := bsoncore.Document(b).LookupErr("documents"); err == nil {
			if arr, ok := v.ArrayOK(); ok {
				vals, _ := arr.Values()
				for _, d := range vals {
					if doc, ok := d.DocumentOK(); ok {
						f.Add([]byte(doc), uint8(0))
					}
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, event []byte, k uint8) { checkRoundTrip(t, event, k) })
}

// TestInsertReadRoundTrip: the round trip's own check stores and reads
// back every event of a valid batch (so the fuzz target cannot pass by
// storing nothing), and a refused event stores none.
func TestInsertReadRoundTrip(t *testing.T) {
	cases := []struct {
		event D
		k     uint8
		want  int
	}{
		{rwtest.Event(rwtest.OID(9), rwtest.DT(5), "s", int32(1)), 0, 1},
		{rwtest.Event(nil, rwtest.DT(-rwtest.Hour), D{{Key: "a", Value: 1}}, 2.5), 2, 3},
		{rwtest.Event(rwtest.OID(2), rwtest.DT(rwtest.Hour), nil, int64(4)), 3, 4},
		{rwtest.Event(rwtest.OID(2), "not a date", "s", int64(4)), 3, 0},
	}
	for _, c := range cases {
		if got := checkRoundTrip(t, marshalSeed(t, c.event), c.k); got != c.want {
			t.Fatalf("%v x%d: %d events stored and read back, want %d", c.event, c.k+1, got, c.want)
		}
	}
}

// checkRoundTrip inserts event k%4+1 times, reads it back and returns how
// many events were stored.
func checkRoundTrip(t *testing.T, event []byte, k uint8) int {
	if l, _, ok := bsoncore.ReadLength(event); !ok || int(l) != len(event) {
		return 0 // trailing bytes: not one document
	}
	if wire.ValidateDocument(event) != nil {
		return 0
	}
	n := int(k%4) + 1
	idx, body := bsoncore.AppendDocumentStart(nil)
	body = bsoncore.AppendStringElement(body, "insert", "readings")
	aidx, body := bsoncore.AppendArrayElementStart(body, "documents")
	for i := range n {
		body = bsoncore.AppendDocumentElement(body, string(rune('0'+i)), event)
	}
	body, _ = bsoncore.AppendArrayEnd(body, aidx)
	body = bsoncore.AppendStringElement(body, "$db", "iot")
	body, _ = bsoncore.AppendDocumentEnd(body, idx)
	rule := rwtest.InsertRule()
	p, err := insert.New(rewrite.Command{Body: body}, rule, insert.Options{NewObjectID: func() bson.ObjectID { return rwtest.OID(1) }})
	if err != nil {
		t.Fatalf("insert of a valid document refused as a command: %v", err)
	}
	buckets := simulateUpstream(t, p.Commands)
	want := event
	if _, ok := bsonutil.Lookup(event, "_id"); !ok {
		want = withIDFirst(event, rwtest.OID(1))
	}
	// readBack answers the aggregate path; the scans of packed events
	// are the e2e tests'.
	for _, caps := range fuzzCaps[1:] {
		got := readBack(t, rule, caps, buckets)
		if len(got) != countEvents(buckets) {
			t.Fatalf("read back %d events of %d stored", len(got), countEvents(buckets))
		}
		for _, g := range got {
			if !bytes.Equal(g, want) {
				t.Fatalf("round trip changed the event:\n got %s\nwant %s", rwtest.JSON(g), rwtest.JSON(want))
			}
		}
	}
	if len(p.Commands) > 0 && countEvents(buckets) == 0 {
		t.Fatal("commands sent but no event stored")
	}
	return countEvents(buckets)
}

// simBucket is a bucket as the upstream would hold it after the insert's
// commands: its _id, meta and events.
type simBucket struct {
	id     bsoncore.Value
	meta   bsoncore.Value
	events []bsoncore.Document
}

// simulateUpstream applies the upsert and insert commands of an insert plan
// the way a MongoDB server would, to buckets that did not exist before.
func simulateUpstream(t *testing.T, cmds []bsoncore.Document) []*simBucket {
	t.Helper()
	byID := map[string]*simBucket{}
	var order []*simBucket
	get := func(id bsoncore.Value) *simBucket {
		k := string(id.Data)
		if b, ok := byID[k]; ok {
			return b
		}
		b := &simBucket{id: id, meta: bsoncore.Value{Type: bsoncore.TypeNull}}
		byID[k] = b
		order = append(order, b)
		return b
	}
	for i, c := range cmds {
		mustValid(t, "insert command", c)
		switch name := elemKey0(c); name {
		case "update":
			for _, st := range docValues(c.Lookup("updates")) {
				b := get(st.Lookup("q", "_id"))
				u := st.Lookup("u").Document()
				for _, op := range []string{"$set", "$setOnInsert"} {
					if m, err := u.LookupErr(op, bucket.FieldMeta); err == nil {
						b.meta = m
					}
				}
				b.events = append(b.events, docValues(u.Lookup("$push", bucket.FieldEvents, "$each"))...)
			}
		case "insert":
			for _, d := range docValues(c.Lookup("documents")) {
				b := get(d.Lookup("_id"))
				if m, err := d.LookupErr(bucket.FieldMeta); err == nil {
					b.meta = m
				}
				b.events = append(b.events, docValues(d.Lookup(bucket.FieldEvents))...)
			}
		default:
			t.Fatalf("command %d is neither insert nor update: %s", i, rwtest.JSON(c))
		}
	}
	return order
}

func docValues(v bsoncore.Value) []bsoncore.Document {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil
	}
	vals, _ := arr.Values()
	out := make([]bsoncore.Document, 0, len(vals))
	for _, x := range vals {
		if d, ok := x.DocumentOK(); ok {
			out = append(out, d)
		}
	}
	return out
}

func countEvents(bs []*simBucket) int {
	n := 0
	for _, b := range bs {
		n += len(b.events)
	}
	return n
}

// readBack plans find {} and answers it as the upstream would: one
// unwound document per stored event (without meta where $unwind drops
// it, answering the proxy's meta lookups instead).
func readBack(t *testing.T, rule *rules.Rule, caps caps.Upstream, bs []*simBucket) []bsoncore.Document {
	t.Helper()
	find := bsoncore.NewDocumentBuilder().AppendString("find", rule.Collection).AppendString("$db", rule.DB).Build()
	p, err := read.PlanRead(find, rule, read.Options{Caps: caps})
	if err != nil || p.Cursor == nil {
		t.Fatalf("find {}: %v", err)
	}
	aidx, batch := bsoncore.AppendArrayStart(nil)
	i := 0
	for _, b := range bs {
		for _, e := range b.events {
			d := bsoncore.NewDocumentBuilder().AppendValue("_id", b.id)
			if caps.UnwindKeepsFields {
				d.AppendValue("meta", b.meta)
			}
			batch = bsoncore.AppendDocumentElement(batch, bsonutil.Itoa(i), d.AppendDocument("events", e).Build())
			i++
		}
	}
	batch, _ = bsoncore.AppendArrayEnd(batch, aidx)
	reply := simCursorReply(batch)
	for _, q := range p.Cursor.MetaQuery(reply) {
		mustValid(t, "meta query", q)
		p.Cursor.AddMetas(metaAnswer(bs))
	}
	out, _, err := p.Cursor.MapReply(reply)
	if err != nil {
		t.Fatalf("map reply: %v", err)
	}
	mustValid(t, "mapped reply", out)
	return docValues(bsoncore.Document(out).Lookup("cursor", "firstBatch"))
}

func simCursorReply(batch []byte) []byte {
	cur := bsoncore.NewDocumentBuilder().AppendArray("firstBatch", batch).AppendInt64("id", 0).AppendString("ns", "iot.readings.buckets").Build()
	return bsoncore.NewDocumentBuilder().AppendDocument("cursor", cur).AppendDouble("ok", 1).Build()
}

// metaAnswer answers every meta lookup at once: the _id and meta of every
// bucket.
func metaAnswer(bs []*simBucket) []byte {
	aidx, batch := bsoncore.AppendArrayStart(nil)
	for i, b := range bs {
		batch = bsoncore.AppendDocumentElement(batch, bsonutil.Itoa(i), bsoncore.NewDocumentBuilder().AppendValue("_id", b.id).AppendValue("meta", b.meta).Build())
	}
	batch, _ = bsoncore.AppendArrayEnd(batch, aidx)
	return simCursorReply(batch)
}

func withIDFirst(doc []byte, id bson.ObjectID) []byte {
	elems, _ := bsoncore.Document(doc).Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	out = bsoncore.AppendObjectIDElement(out, "_id", id)
	for _, e := range elems {
		out = append(out, e...)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

func elemKey0(d bsoncore.Document) string {
	elems, err := d.Elements()
	if err != nil || len(elems) == 0 {
		return ""
	}
	return elems[0].Key()
}
