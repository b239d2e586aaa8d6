package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/rules"
)

// bigEvent is an event of one series carrying a string of size bytes.
func bigEvent(sensor string, ts time.Time, size int) (sentEvent, bson.D) {
	e := sentEvent{id: bson.NewObjectID(), sensor: sensor, ts: ts, value: 1}
	return e, append(e.doc(), bson.E{Key: "blob", Value: strings.Repeat("x", size)})
}

// TestFaultLargeEvents: buckets never grow past the
// rule's maxBytes (at most 8 MiB, well under the 16 MiB document limit):
// large events start new buckets; an event larger than maxBytes gets a
// per-event BSONObjectTooLarge write error while the rest of the batch is
// stored; one larger than 16 MiB is refused by the driver itself.
func TestFaultLargeEvents(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	const maxBytes = 8 << 20
	rule := fmt.Sprintf(`rules:
  - namespace: %s.readings
    timeField: ts
    metaField: sensorId
    bucket:
      span: 1h
      maxEvents: 1000
      maxBytes: 8MiB
`, db)
	p := startProxy(t, proxyOptions{yaml: rule})
	ctx := ctxFor(t)
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

	// 14 events of 1 MiB in one batch, then 4 one by one (upserts into the
	// open bucket): one series and window, 18 MiB in all.
	var sent []sentEvent
	var docs []any
	for i := 0; i < 14; i++ {
		e, d := bigEvent("big", base.Add(time.Duration(i)*time.Second), 1<<20)
		sent, docs = append(sent, e), append(docs, d)
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("14 events of 1 MiB: %v", err)
	}
	for i := 14; i < 18; i++ {
		e, d := bigEvent("big", base.Add(time.Duration(i)*time.Second), 1<<20)
		if _, err := coll.InsertOne(ctx, d); err != nil {
			t.Fatalf("event %d of 1 MiB: %v", i, err)
		}
		sent = append(sent, e)
	}

	// An event over maxBytes between two small ones, unordered: a write
	// error for it alone.
	small1, d1 := bigEvent("big", base.Add(time.Minute), 10)
	_, over := bigEvent("big", base.Add(time.Minute+time.Second), maxBytes+1)
	small2, d2 := bigEvent("big", base.Add(time.Minute+2*time.Second), 10)
	_, err := coll.InsertMany(ctx, []any{d1, over, d2}, options.InsertMany().SetOrdered(false))
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 1 || bwe.WriteErrors[0].Code != 10334 {
		t.Fatalf("event over maxBytes: want one BSONObjectTooLarge (10334) write error at index 1, got %v", err)
	}
	if msg := bwe.WriteErrors[0].Message; !strings.Contains(msg, "maxBytes") || !strings.Contains(msg, db+".readings") {
		t.Fatalf("the error should name maxBytes and the rule: %q", msg)
	}
	sent = append(sent, small1, small2)

	// 15.9 MiB: a valid document for MongoDB, too large for a bucket.
	_, huge := bigEvent("big", base.Add(2*time.Minute), 16<<20-100<<10)
	_, err = coll.InsertOne(ctx, huge)
	var we mongo.WriteException
	if !errors.As(err, &we) || len(we.WriteErrors) != 1 || we.WriteErrors[0].Code != 10334 {
		t.Fatalf("15.9 MiB event: want BSONObjectTooLarge (10334), got %v", err)
	}
	t.Logf("15.9 MiB event: %v", we.WriteErrors[0].Message)

	// Over 16 MiB: the Go driver sends it; MongoDB refuses such a document
	// with BSONObjectTooLarge, and so does the proxy.
	_, tooBig := bigEvent("big", base.Add(3*time.Minute), 17<<20)
	_, err = coll.InsertOne(ctx, tooBig)
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 10334 || ce.Name != "BSONObjectTooLarge" {
		t.Fatalf("17 MiB event: want BSONObjectTooLarge (10334), got %v", err)
	}
	t.Logf("17 MiB event: %v", err)
	if err := coll.Database().Client().Ping(ctx, nil); err != nil {
		t.Fatalf("the client after a too large event: %v", err)
	}

	// Every bucket under maxBytes of events and far under 16 MiB, every
	// event stored once.
	cur, err := direct(t).Database(db).Collection("readings.buckets").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	largest := 0
	var n int
	for cur.Next(ctx) {
		n++
		largest = max(largest, len(cur.Current))
		if b, _ := cur.Current.Lookup("bytes").AsInt64OK(); b > maxBytes {
			t.Fatalf("bucket holds %d bytes of events, over maxBytes %d", b, maxBytes)
		}
		if len(cur.Current) > 16<<20 {
			t.Fatalf("bucket document of %d bytes, over 16 MiB", len(cur.Current))
		}
	}
	if err := cur.Err(); err != nil {
		t.Fatal(err)
	}
	got := storedIDs(t, ctx, db)
	for _, e := range sent {
		if got[e.id] != 1 {
			t.Fatalf("event %v stored %d times", e.id, got[e.id])
		}
	}
	total := 0
	for _, c := range got {
		total += c
	}
	if total != len(sent) {
		t.Fatalf("%d events stored, %d sent and acknowledged", total, len(sent))
	}
	t.Logf("%d events (18 of 1 MiB) in %d buckets; largest bucket document %d bytes", len(sent), n, largest)
	if n < 3 {
		t.Fatalf("18 MiB of events in %d buckets of at most 8 MiB", n)
	}

	// A rule asking for buckets over 8 MiB is refused at load.
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(strings.Replace(rule, "8MiB", "16MiB", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = rules.Load(rules.LoadOptions{ConfigFile: file, Flags: pflag.NewFlagSet("none", pflag.ContinueOnError)})
	if err == nil || !strings.Contains(err.Error(), "maxBytes") {
		t.Fatalf("maxBytes 16MiB: want a config error naming maxBytes, got %v", err)
	}
	t.Logf("maxBytes 16MiB: %v", err)
}
