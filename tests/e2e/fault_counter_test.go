package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/layout"
)

// counterBucket is a stored counter bucket.
type counterBucket struct {
	Meta  string        `bson:"meta"`
	Start bson.DateTime `bson:"start"`
	Total int64         `bson:"total"`
	Slots counterSlots  `bson:"slots"`
}

// counterSlots are a counter bucket's counts by slot, stored a field per
// slot or, on FerretDB, packed (rewrite/layout's packed.go: the BSON of
// the same document in a binary field, raw or one zstd frame).
type counterSlots map[string]int64

func (c *counterSlots) UnmarshalBSONValue(typ byte, data []byte) error {
	doc := data
	if bson.Type(typ) == bson.TypeBinary {
		sub, bin, ok := bson.RawValue{Type: bson.TypeBinary, Value: data}.BinaryOK()
		switch {
		case !ok:
			return fmt.Errorf("slots: damaged binary")
		case sub == layout.SlotsPackedSubtype:
			doc = bin
		case sub == layout.SlotsPackedZstdSubtype:
			raw, err := bucket.Decompress(bin)
			if err != nil {
				return fmt.Errorf("slots: %w", err)
			}
			doc = raw
		default:
			return fmt.Errorf("slots: binary subtype %#x", sub)
		}
	} else if bson.Type(typ) != bson.TypeEmbeddedDocument {
		return fmt.Errorf("slots: a %s", bson.Type(typ))
	}
	m := map[string]int64{}
	if err := bson.Unmarshal(doc, &m); err != nil {
		return err
	}
	*c = m
	return nil
}

// readCounterBuckets reads db's counter buckets directly.
func readCounterBuckets(t *testing.T, ctx context.Context, db string) []counterBucket {
	t.Helper()
	cur, err := direct(t).Database(db).Collection("hits.buckets").Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var buckets []counterBucket
	if err := cur.All(ctx, &buckets); err != nil {
		t.Fatal(err)
	}
	return buckets
}

// counterBuckets reads db's counter buckets directly: the count of each
// (page, second) and the sum of the buckets' totals.
func counterBuckets(t *testing.T, ctx context.Context, db string) (map[slotKey]int, int64) {
	t.Helper()
	got := map[slotKey]int{}
	var total int64
	for _, b := range readCounterBuckets(t, ctx, db) {
		var inSlots int64
		for s, c := range b.Slots {
			var i int64
			fmt.Sscan(s, &i)
			got[slotKey{b.Meta, b.Start.Time().Unix() + i}] += int(c)
			inSlots += c
		}
		if inSlots != b.Total {
			t.Fatalf("bucket %s %v: total %d, slots sum to %d (a half-applied upsert)", b.Meta, b.Start.Time(), b.Total, inSlots)
		}
		total += b.Total
	}
	return got, total
}

// TestFaultCounterReplyLostRetry: the upstream connection is cut after a
// counter upsert reached the upstream and before its reply came back.
// FerretDB ignores lsid/txnNumber; the driver's retry must not count the
// hits twice (the bucket's write marks, rewrite/counter_retry.go), and an
// acknowledged insert must be counted exactly once.
func TestFaultCounterReplyLostRetry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		n      int    // hits of the insert whose reply is lost
		retry  string // the driver's retryWrites
		ingest string // the rule's ingest mode ("": auto, staged on FerretDB)
	}{
		{"fewBuckets", 200, "true", ""},   // 5 pages x 10 minutes
		{"manyBuckets", 3000, "true", ""}, // more buckets: split into several commands where the upstream limits them
		{"noRetry", 200, "false", ""},     // the app sees the failure; commands up to the cut one counted once
		{"noRetryMany", 3000, "false", ""},
		{"twoLostReplies", 200, "true", ""}, // the retry's reply is lost too: the app sees an error, counts stay exact
		// Written directly: on FerretDB each bucket whole (packed), its
		// write's mark carried in it.
		{"direct/fewBuckets", 200, "true", "direct"},
		{"direct/manyBuckets", 3000, "true", "direct"},
		{"direct/noRetry", 200, "false", "direct"},
		{"direct/twoLostReplies", 200, "true", "direct"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := uniqueDB(t)
			r := newRelay(t, upstreamAddr(t))
			yaml := counterRule(db)
			if tc.ingest != "" {
				yaml += "    ingest: " + tc.ingest + "\n"
			}
			p := startProxy(t, proxyOptions{yaml: yaml, upstreamURI: r.URI()})
			ctx := ctxFor(t)
			coll := connect(t, p.URI(), "retryWrites="+tc.retry).Database(db).Collection("hits")
			warm, want := genHits(300, 11)
			if _, err := coll.InsertMany(ctx, warm); err != nil {
				t.Fatal(err)
			}
			batch, wantBatch := genHits(tc.n, 12)
			cuts := int64(1)
			if strings.HasSuffix(tc.name, "twoLostReplies") {
				cuts = 2
			}
			r.CutReplyOf(int(cuts), bucketWrite)
			start := time.Now()
			_, err := coll.InsertMany(ctx, batch)
			took := time.Since(start)
			switch got := r.cuts.Load(); {
			case got == cuts:
			case got >= 1 && got < cuts:
				// One bucket write an attempt (an upstream that bounds no
				// update's statements): the retry found it applied and
				// wrote nothing, so there was no second reply to cut.
				t.Logf("the relay cut %d replies of %d: the retry had no bucket write left", got, cuts)
				cuts = got
			default:
				t.Fatalf("the relay cut %d replies, want %d (err %v)", got, cuts, err)
			}
			got, total := counterBuckets(t, ctx, db)
			over, under := 0, 0
			for k, c := range wantBatch {
				want[k] += c
			}
			for k, c := range want {
				switch {
				case got[k] > c:
					over += got[k] - c
				case got[k] < c:
					under += c - got[k]
				}
			}
			for k, c := range got {
				if _, ok := want[k]; !ok {
					over += c
				}
			}
			t.Logf("retryWrites=%s, %d hits: insert returned after %v: err=%v; counted %d of %d, over %d, under %d",
				tc.retry, tc.n, took.Round(time.Millisecond), err, total, 300+tc.n, over, under)
			if over > 0 {
				t.Fatalf("%d hits counted twice after a lost reply (err %v)", over, err)
			}
			if err == nil && under != 0 {
				t.Fatalf("insert acknowledged but %d hits not counted", under)
			}
			if tc.retry == "true" && cuts == 1 && err != nil {
				t.Fatalf("the driver's retry failed: %v", err)
			}
			// The proxy serves the same client afterwards, counting once.
			more, wantMore := genHits(50, 13)
			if _, err := coll.InsertMany(ctx, more); err != nil {
				t.Fatalf("insert after the fault: %v", err)
			}
			got2, _ := counterBuckets(t, ctx, db)
			for k, c := range wantMore {
				if got2[k]-got[k] != c {
					t.Fatalf("after the fault, %v counted %d more, want %d", k, got2[k]-got[k], c)
				}
			}
		})
	}
}

// TestFaultSlotsReplyLostRetry: the same fault on the slots layout. Its
// upserts write absolute values (num_samples counts a slot once, from the
// bucket read before the write, under the proxy's lock), so the driver's
// retry of an applied write rewrites the same values: harmless, with no
// marks needed. num_samples and total_samples stay exact.
func TestFaultSlotsReplyLostRetry(t *testing.T) {
	t.Parallel()
	db := uniqueDB(t)
	r := newRelay(t, upstreamAddr(t))
	p := startProxy(t, proxyOptions{yaml: slotsRule(db, ""), upstreamURI: r.URI()})
	ctx := ctxFor(t)
	coll := connect(t, p.URI(), "retryWrites=true").Database(db).Collection("cpu")
	want := map[sampleKey]float64{}
	samples := func(from, n int) []any {
		var docs []any
		for i := from; i < from+n; i++ {
			for h, host := range []string{"web-1", "web-2", "db-1"} {
				ts := slotsBase.Add(time.Duration(i) * 10 * time.Second)
				v := float64((i*(h+3))%100) + 0.5
				docs = append(docs, bson.D{{Key: "host", Value: host}, {Key: "ts", Value: bson.NewDateTimeFromTime(ts)}, {Key: "cpu", Value: v}})
				want[sampleKey{host, ts.Unix()}] = v
			}
		}
		return docs
	}
	if _, err := coll.InsertMany(ctx, samples(0, 100)); err != nil {
		t.Fatal(err)
	}
	r.CutReplyOf(1, bucketWrite)
	// Half of the batch lands in the windows the warm-up wrote, half
	// beyond them.
	if _, err := coll.InsertMany(ctx, samples(50, 500)); err != nil {
		t.Fatalf("the driver's retry failed: %v", err)
	}
	if r.cuts.Load() != 1 {
		t.Fatalf("the relay cut %d replies, want 1", r.cuts.Load())
	}
	stored := checkSlotsSamples(t, readSlotsBuckets(t, db), want, "after a retried write")
	if stored != int64(len(want)) {
		t.Fatalf("%d samples stored, want %d", stored, len(want))
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != int64(len(want)) {
		t.Fatalf("count through the proxy: %d %v, want %d", n, err, len(want))
	}
}
