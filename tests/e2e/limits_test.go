package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestLimitMaxMessageBytes: with limits.maxMessageBytes 64 KiB (from the
// config file), hello announces that limit, so the driver splits a 2,000
// event insertMany into messages under it and every event is stored; a
// document too large for the limit is refused with an error; a raw
// message over the limit is answered with an error naming the limit
// before its connection is closed; other clients keep being served.
func TestLimitMaxMessageBytes(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	const limit = 64 * 1024
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000) + "limits:\n  maxMessageBytes: 65536\n"})
	if p.cfg.Limits.MaxMessageBytes != limit {
		t.Fatalf("config: maxMessageBytes %d", p.cfg.Limits.MaxMessageBytes)
	}
	ctx := ctxFor(t)
	by := newBystander(t, p)
	c := connect(t, p.URI())
	var hello bson.M
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		t.Fatal(err)
	}
	if hello["maxMessageSizeBytes"] != int32(limit) || hello["maxBsonObjectSize"].(int32) >= limit {
		t.Fatalf("hello announces maxMessageSizeBytes %v, maxBsonObjectSize %v; want the proxy's limit %d", hello["maxMessageSizeBytes"], hello["maxBsonObjectSize"], limit)
	}

	sent := genEvents(2000, 5, 2, 17)
	docs := make([]any, len(sent))
	for i, e := range sent {
		docs[i] = e.doc()
	}
	if _, err := c.Database(db).Collection("readings").InsertMany(ctx, docs); err != nil {
		t.Fatalf("insertMany of %d events under a 64 KiB message limit: %v", len(docs), err)
	}
	checkStored(t, readBuckets(t, ctx, db), sent, 1000)

	big := bson.D{{Key: "_id", Value: "big"}, {Key: "pad", Value: strings.Repeat("x", 100_000)}}
	if _, err := c.Database(db).Collection("items").InsertOne(ctx, big); err == nil {
		t.Fatal("a 100 KB document went through a 64 KiB limit")
	} else {
		t.Logf("driver, 100 KB document: %v", err)
	}

	// A client that ignores the announced limit.
	raw := dialRaw(t, p.addr)
	body := marshal(t, bson.D{{Key: "insert", Value: "items"}, {Key: "documents", Value: bson.A{big}}, {Key: "$db", Value: db}})
	id := raw.sendMsg(body, 0)
	errorReply(t, raw.readMsgReply(id), 10334, "BSONObjectTooLarge", "limits.maxMessageBytes", "65536")
	raw.expectClosed(10 * time.Second)

	by.check()
	if n, err := c.Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(sent)) {
		t.Fatalf("events after the refusals: %d %v", n, err)
	}
	if n, _ := direct(t).Database(db).Collection("items").CountDocuments(ctx, bson.D{}); n != 0 {
		t.Fatalf("%d oversized documents stored", n)
	}
}

// TestLimitMaxCursors: with limits.maxCursors 3, three open cursors of
// rewritten reads are kept; a fourth is refused with an error naming the
// limit (its upstream cursor killed), while the three read to the end,
// reads that need no cursor and plain cursors keep working, and once the
// cursors are exhausted a new one is accepted.
func TestLimitMaxCursors(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000) + "limits:\n  maxCursors: 3\n"})
	ctx := ctxFor(t)
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	sent := genEvents(60, 3, 1, 23)
	docs := make([]any, len(sent))
	for i, e := range sent {
		docs[i] = e.doc()
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	small := options.Find().SetBatchSize(5)
	count := func(cur *mongo.Cursor, err error) int { return drain(t, ctx, cur, err) }
	var open []*mongo.Cursor
	for range 3 {
		cur, err := coll.Find(ctx, bson.D{}, small)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, cur)
	}
	if n := p.srv.OpenCursors(); n != 3 {
		t.Fatalf("registry holds %d cursors, want 3", n)
	}
	other := connect(t, p.URI()) // another client, its own connections
	_, err := other.Database(db).Collection("readings").Find(ctx, bson.D{}, small)
	var se mongo.ServerError
	if err == nil || !errors.As(err, &se) || !se.HasErrorCode(8002) || !strings.Contains(err.Error(), "limits.maxCursors") {
		t.Fatalf("fourth cursor: want TooManyCursors naming limits.maxCursors, got %v", err)
	}
	t.Logf("fourth cursor: %v", err)
	// Reads without a cursor left open, and plain cursors, still work.
	if n, err := other.Database(db).Collection("readings").CountDocuments(ctx, bson.D{}); err != nil || n != 60 {
		t.Fatalf("count at the limit: %d %v", n, err)
	}
	if got := count(other.Database(db).Collection("readings").Find(ctx, bson.D{})); got != 60 {
		t.Fatalf("single-batch find at the limit: %d events", got)
	}
	plain := other.Database(db).Collection("items")
	for i := range 7 {
		if _, err := plain.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := count(plain.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))); got != 7 {
		t.Fatalf("plain cursor at the limit: %d documents", got)
	}
	for i, cur := range open {
		if got := drain(t, ctx, cur, nil); got != 60 {
			t.Fatalf("cursor %d read %d events to the end, want 60", i, got)
		}
	}
	if n := p.srv.OpenCursors(); n != 0 {
		t.Fatalf("registry holds %d cursors after all were exhausted", n)
	}
	if got := count(coll.Find(ctx, bson.D{}, small)); got != 60 {
		t.Fatalf("new cursor after the others closed: %d events", got)
	}
}

// drain reads a cursor to its end and returns how many documents it gave.
func drain(t *testing.T, ctx context.Context, cur *mongo.Cursor, err error) int {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close(ctx)
	n := 0
	for cur.Next(ctx) {
		n++
	}
	if err := cur.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
