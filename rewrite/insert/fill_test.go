package insert

import (
	"testing"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// fillsOf answers Buckets from a map keyed by meta string (window 0).
func fillsOf(m map[string]bucket.Fill) func(bucket.Key) bucket.Fill {
	return func(k bucket.Key) bucket.Fill {
		for meta, f := range m {
			if bucket.KeyOf(mustValue(meta), 0).String() == k.String() {
				return f
			}
		}
		return bucket.Fill{Seq: -1, Known: true}
	}
}

func mustValue(s string) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, s)}
}

func TestInsertFills(t *testing.T) {
	e := func(i byte) bson.D { return rwtest.Event(rwtest.OID(i), rwtest.DT(int64(i)), "s", nil) }
	se := func(i byte) bson.D { return rwtest.Stored(rwtest.OID(i), rwtest.DT(int64(i)), true, nil) }
	ts := func(lo, hi int64) (bson.D, bson.D) {
		return bson.D{{Key: "min.ts", Value: rwtest.DT(lo)}}, bson.D{{Key: "max.ts", Value: rwtest.DT(hi)}}
	}
	sz := func(ids ...byte) int32 {
		var ds []bson.D
		for _, i := range ids {
			ds = append(ds, se(i))
		}
		return size(t, ds...)
	}
	rule := rwtest.InsertRule() // 3 events per bucket, threshold 3
	events := []bson.D{e(1), e(2), e(3), e(4), e(5)}

	// Open bucket seq 2 holds 1 event: two fit (one upsert), then a new
	// bucket 3 of 3 events (complete insert, threshold 3).
	o := opts()
	o.Buckets = fillsOf(map[string]bucket.Fill{"s": {Seq: 2, Count: 1, Bytes: 10, Known: true}})
	p := mustInsert(t, rwtest.BodyCmd(t, events), rule, o)
	mn, mx := ts(1, 2)
	bucket3 := bson.D{
		{Key: "_id", Value: bid("s", 0, 3)}, {Key: "meta", Value: "s"}, {Key: "start", Value: rwtest.DT(0)},
		{Key: "count", Value: int32(3)}, {Key: "bytes", Value: sz(3, 4, 5)},
		{Key: "min", Value: bson.D{{Key: "ts", Value: rwtest.DT(3)}}}, {Key: "max", Value: bson.D{{Key: "ts", Value: rwtest.DT(5)}}},
		{Key: "counted", Value: int32(3)},
		{Key: "summed", Value: bson.D{{Key: "value", Value: true}}},
		{Key: "events", Value: bson.A{se(3), se(4), se(5)}},
	}
	assertCommands(t, p,
		insertCmd(true, []bson.D{bucket3}),
		rwtest.UpdateCmd(true, []bson.D{upsertAt(2, false, 3, 1<<20, "s", 0, 2, sz(1, 2), bson.A{se(1), se(2)}, nil, mn, mx)}))
	got := p.Fills(okReplies(t, p))
	if len(got) != 1 || got[0].Fill != (bucket.Fill{Seq: 3, Count: 3, Bytes: int64(sz(3, 4, 5)), Known: true}) {
		t.Errorf("fills = %+v", got)
	}
	// A failed statement makes the key's fill unknown.
	failed := []bsoncore.Document{upReply(t, 0, bson.A{upErr(0, 2, "no")}), upReply(t, 1, nil)}
	if got := p.Fills(failed); got[0].Fill.Known {
		t.Errorf("fill after a failure is known: %+v", got[0].Fill)
	}

	// The same on an upstream with _id-only filters: q is {_id} alone.
	o = opts()
	o.Caps = caps.Upstream{IDOnlyFilters: true, MaxUpdateStatements: 1}
	o.Buckets = fillsOf(map[string]bucket.Fill{"s": {Seq: 0, Count: 2, Bytes: 10, Known: true}})
	p = mustInsert(t, rwtest.BodyCmd(t, events[:2]), rule, o)
	mn, mx = ts(1, 1)
	mn2, mx2 := ts(2, 2)
	assertCommands(t, p,
		rwtest.UpdateCmd(true, []bson.D{upsertAt(0, true, 3, 1<<20, "s", 0, 1, sz(1), bson.A{se(1)}, nil, mn, mx)}),
		rwtest.UpdateCmd(true, []bson.D{upsertAt(1, true, 3, 1<<20, "s", 0, 1, sz(2), bson.A{se(2)}, nil, mn2, mx2)}))

	// A full open bucket (by bytes) gets nothing; an unknown fill is "none".
	o = opts()
	o.Buckets = fillsOf(map[string]bucket.Fill{"s": {Seq: 4, Count: 0, Bytes: 1 << 20, Known: true}})
	p = mustInsert(t, rwtest.BodyCmd(t, events[:1]), rule, o)
	mn, mx = ts(1, 1)
	assertCommands(t, p, rwtest.UpdateCmd(true, []bson.D{upsertAt(5, false, 3, 1<<20, "s", 0, 1, sz(1), bson.A{se(1)}, nil, mn, mx)}))
	o.Buckets = fillsOf(map[string]bucket.Fill{"s": {Seq: 4, Count: 1}})
	p = mustInsert(t, rwtest.BodyCmd(t, events[:1]), rule, o)
	assertCommands(t, p, rwtest.UpdateCmd(true, []bson.D{upsertAt(0, false, 3, 1<<20, "s", 0, 1, sz(1), bson.A{se(1)}, nil, mn, mx)}))
}

func TestInsertRetry(t *testing.T) {
	const dup = "E11000 duplicate key error"
	e := func(i byte, meta string) bson.D { return rwtest.Event(rwtest.OID(i), rwtest.DT(int64(i)), meta, nil) }
	rule := rwtest.InsertRule()
	rule.InsertThreshold = 100
	events := []bson.D{e(1, "a"), e(2, "b"), e(3, "a")}
	for _, ordered := range []bool{true, false} {
		o := opts()
		o.Caps = caps.Upstream{StmtIDs: true}
		p := mustInsert(t, rwtest.BodyCmd(t, events, bson.E{Key: "ordered", Value: ordered},
			bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(1)}), rule, o)
		// One update: a (events 0, 2) into seq 0, b (event 1) into seq 0.
		// Bucket a/0 turned out full: duplicate key on statement 0.
		replies := []bsoncore.Document{upReply(t, 1, bson.A{upErr(0, 11000, dup)})}
		if !p.Retriable(replies) {
			t.Fatalf("ordered=%v: duplicate key not retriable", ordered)
		}
		if f := p.Fills(replies); f[0].Fill.Known {
			t.Errorf("ordered=%v: fill of the duplicate key's series is known", ordered)
		}
		next := p.Retry(replies, fillsOf(map[string]bucket.Fill{"a": {Seq: 0, Count: 3, Known: true}, "b": {Seq: 0, Count: 1, Known: true}}))
		if next == nil {
			t.Fatalf("ordered=%v: no retry", ordered)
		}
		// Ordered: b's statement did not run after the failure, so it is
		// retried too (into its seq 0, now holding 1); unordered: b was
		// written, only a is retried, into seq 1. stmtIds are kept.
		var want []bson.D
		aStmt := upsertAt(1, false, 3, 1<<20, "a", 0, 2, size(t, rwtest.Stored(rwtest.OID(1), rwtest.DT(1), true, nil), rwtest.Stored(rwtest.OID(3), rwtest.DT(3), true, nil)),
			bson.A{rwtest.Stored(rwtest.OID(1), rwtest.DT(1), true, nil), rwtest.Stored(rwtest.OID(3), rwtest.DT(3), true, nil)}, nil,
			bson.D{{Key: "min.ts", Value: rwtest.DT(1)}}, bson.D{{Key: "max.ts", Value: rwtest.DT(3)}})
		stmtIDs := bson.A{int32(0)}
		want = []bson.D{aStmt}
		if ordered {
			want = append(want, upsertAt(0, false, 3, 1<<20, "b", 0, 1, size(t, rwtest.Stored(rwtest.OID(2), rwtest.DT(2), true, nil)),
				bson.A{rwtest.Stored(rwtest.OID(2), rwtest.DT(2), true, nil)}, nil, bson.D{{Key: "min.ts", Value: rwtest.DT(2)}}, bson.D{{Key: "max.ts", Value: rwtest.DT(2)}}))
			stmtIDs = append(stmtIDs, int32(1))
		}
		assertCommands(t, next, rwtest.UpdateCmd(ordered, want, bson.E{Key: "stmtIds", Value: stmtIDs},
			bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(1)}))
		if next.Round() != 1 {
			t.Errorf("round %d", next.Round())
		}
		rwtest.AssertDoc(t, "reply after retry", next.Reply(okReplies(t, next)), reply(3))
	}

	// Rounds are bounded; then the duplicate key is reported.
	p := mustInsert(t, rwtest.BodyCmd(t, events[:1]), rule, opts())
	dupReply := []bsoncore.Document{upReply(t, 0, bson.A{upErr(0, 11000, dup)})}
	rounds := 0
	for next := p; next != nil; next = next.Retry(dupReply, nil) {
		p = next
		rounds++
	}
	if rounds != maxInsertRounds {
		t.Errorf("%d rounds, want %d", rounds, maxInsertRounds)
	}
	rwtest.AssertDoc(t, "reply after the last round", p.Reply(dupReply), reply(0, we{0, 11000, dup}))

	// Other failures and transactions are not retried.
	p = mustInsert(t, rwtest.BodyCmd(t, events), rule, opts())
	if p.Retry([]bsoncore.Document{upReply(t, 0, bson.A{upErr(0, 2, "no")})}, nil) != nil {
		t.Errorf("a non-duplicate-key failure was retried")
	}
	p = mustInsert(t, rwtest.BodyCmd(t, events, bson.E{Key: "autocommit", Value: false}), rule, opts())
	if p.Retry(dupReply, nil) != nil {
		t.Errorf("a transaction statement was retried")
	}
}

func TestInsertKeys(t *testing.T) {
	events := []bson.D{
		rwtest.Event(rwtest.OID(1), rwtest.DT(rwtest.Hour+5), "b", nil), rwtest.Event(rwtest.OID(2), rwtest.DT(5), "b", nil), rwtest.Event(rwtest.OID(3), rwtest.DT(7), "a", nil),
		rwtest.Event(rwtest.OID(4), rwtest.DT(6), "b", nil), {{Key: "sensorId", Value: "c"}}, rwtest.Event(rwtest.OID(5), rwtest.DT(9), nil, nil),
	}
	keys, err := Keys(rwtest.BodyCmd(t, events), rwtest.InsertRule())
	if err != nil {
		t.Fatal(err)
	}
	want := []bucket.Key{bucket.KeyOf(mustValue("a"), 0), bucket.KeyOf(mustValue("b"), 0), bucket.KeyOf(bsoncore.Value{}, 0), bucket.KeyOf(mustValue("b"), rwtest.Hour)}
	if len(keys) != len(want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	for i := range want {
		if keys[i].String() != want[i].String() {
			t.Errorf("key %d = %v, want %v", i, keys[i], want[i])
		}
	}
	if _, err := Keys(rewrite.Command{Body: rwtest.Doc(t, bson.D{{Key: "insert", Value: "other"}})}, rwtest.InsertRule()); err == nil {
		t.Errorf("InsertKeys accepted an insert into another collection")
	}
}

// TestInsertCostlyUpdates: where an update rewrites the whole bucket
// (FerretDB), a small group joins the open bucket only while it is below
// the insert threshold, a group at the threshold never joins, and a new
// bucket, however small, is inserted whole rather than upserted.
func TestInsertCostlyUpdates(t *testing.T) {
	e := func(i byte) bson.D { return rwtest.Event(rwtest.OID(i), rwtest.DT(int64(i)), "s", nil) }
	rule := rwtest.InsertRule() // 3 events per bucket, threshold 3
	rule.MaxEvents = 10
	costly := caps.Upstream{IDOnlyFilters: true, CostlyUpdates: true}
	cases := []struct {
		name     string
		fill     bucket.Fill
		events   int
		wantSeqs []int // seq of each statement's bucket, inserts first
		inserts  int
	}{
		{"small group, small bucket: joins", bucket.Fill{Seq: 0, Count: 2, Bytes: 10, Known: true}, 1, []int{0}, 0},
		{"small group, bucket at threshold: new bucket, inserted whole", bucket.Fill{Seq: 0, Count: 3, Bytes: 10, Known: true}, 1, []int{1}, 1},
		{"small group, no bucket yet: inserted whole", bucket.Fill{Seq: -1, Known: true}, 2, []int{0}, 1},
		{"group at threshold: its own bucket", bucket.Fill{Seq: 4, Count: 1, Bytes: 10, Known: true}, 3, []int{5}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var evs []bson.D
			for i := 1; i <= c.events; i++ {
				evs = append(evs, e(byte(i)))
			}
			o := opts()
			o.Caps = costly
			o.Buckets = fillsOf(map[string]bucket.Fill{"s": c.fill})
			p := mustInsert(t, rwtest.BodyCmd(t, evs), rule, o)
			got := p.Fills(okReplies(t, p))
			if len(got) != 1 || got[0].Fill.Seq != c.wantSeqs[len(c.wantSeqs)-1] {
				t.Fatalf("fills = %+v, want last seq %d", got, c.wantSeqs[len(c.wantSeqs)-1])
			}
			inserts := 0
			for _, cmd := range p.Commands {
				if _, err := cmd.LookupErr("insert"); err == nil {
					inserts++
				}
			}
			if inserts != c.inserts {
				t.Fatalf("%d insert commands, want %d", inserts, c.inserts)
			}
		})
	}
}
