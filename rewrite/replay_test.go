package rewrite

import (
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestMayBeUnseenRetry(t *testing.T) {
	evs := []bson.D{ev(oid(1), dt(1000), "a", 1.0)}
	txn := bson.E{Key: "txnNumber", Value: int64(3)}
	cases := []struct {
		name string
		cmd  Command
		caps caps.Upstream
		want bool
	}{
		{"retryable on FerretDB", bodyCmd(t, evs, txn), caps.Upstream{IDOnlyFilters: true}, true},
		{"no txnNumber", bodyCmd(t, evs), caps.Upstream{}, false},
		{"upstream dedups (MongoDB)", bodyCmd(t, evs, txn), caps.Upstream{StmtIDs: true}, false},
		{"transaction statement", bodyCmd(t, evs, txn, bson.E{Key: "autocommit", Value: false}), caps.Upstream{}, false},
	}
	for _, c := range cases {
		if got := MayBeUnseenRetry(c.cmd, c.caps); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

// storedSet is the identities of a bucket of meta holding events.
func storedSet(t *testing.T, meta any, events ...bson.D) map[string]bool {
	t.Helper()
	arr := bson.A{}
	for _, e := range events {
		arr = append(arr, e)
	}
	set := map[string]bool{}
	StoredEventIdentities(bson.Raw(mustDoc(t, bson.D{{Key: "_id", Value: oid(9)}, {Key: "meta", Value: meta}, {Key: "events", Value: arr}})), testRule(), set)
	return set
}

func TestWithoutStored(t *testing.T) {
	rule := testRule()
	e0 := ev(oid(1), dt(1000), "a", 1.0)
	e1 := ev(oid(2), dt(2000), "a", 2.0)
	e2 := ev(oid(3), dt(3000), "b", 3.0)
	noMeta := ev(oid(4), dt(4000), nil, 4.0)
	batch := []bson.D{e0, e1, e2, noMeta}
	cases := []struct {
		name    string
		stored  map[string]bool
		keep    []bson.D // nil: no filter
		allDone bool
	}{
		{"nothing stored", storedSet(t, "a"), nil, false},
		{"first two stored", storedSet(t, "a", stored(oid(1), dt(1000), true, 1.0), stored(oid(2), dt(2000), true, 2.0)), []bson.D{e2, noMeta}, false},
		// Same _id, other series: a different event, kept.
		{"same _id other series", storedSet(t, "b", stored(oid(1), dt(1000), true, 1.0)), nil, false},
		// Same _id and series, other time: a different event, kept.
		{"same _id other time", storedSet(t, "a", stored(oid(1), dt(1001), true, 1.0)), nil, false},
		{"null meta matches a missing one", storedSet(t, nil, stored(oid(4), dt(4000), false, 4.0)), []bson.D{e0, e1, e2}, false},
	}
	for _, c := range cases {
		for _, form := range []struct {
			name string
			mk   func(testing.TB, []bson.D, ...bson.E) Command
		}{{"body", bodyCmd}, {"sequence", seqCmd}} {
			f := WithoutStored(form.mk(t, batch), rule, c.stored)
			if c.keep == nil {
				if f != nil {
					t.Errorf("%s/%s: filtered %d events, want none", c.name, form.name, f.Skipped())
				}
				continue
			}
			if f == nil {
				t.Fatalf("%s/%s: no filter", c.name, form.name)
			}
			want := form.mk(t, c.keep)
			assertDoc(t, c.name+" body", f.Command.Body, bson.Raw(want.Body))
			if form.name == "sequence" {
				got, w := f.Command.Sequences[0].Documents, want.Sequences[0].Documents
				if len(got) != len(w) {
					t.Fatalf("%s: %d documents, want %d", c.name, len(got), len(w))
				}
				for i := range got {
					assertDoc(t, c.name+" doc", got[i], bson.Raw(w[i]))
				}
			}
			if f.AllStored() != c.allDone || f.Skipped() != len(batch)-len(c.keep) {
				t.Errorf("%s: skipped %d, all %v", c.name, f.Skipped(), f.AllStored())
			}
		}
	}
}

func TestReplayFilterReplies(t *testing.T) {
	rule := testRule()
	batch := []bson.D{ev(oid(1), dt(1000), "a", 1.0), ev(oid(2), dt(2000), "a", 2.0), ev(oid(3), dt(3000), "a", 3.0), ev(oid(4), dt(4000), "a", 4.0)}
	// Events 0 and 2 stored: the filtered insert is [1, 3].
	f := WithoutStored(bodyCmd(t, batch), rule, storedSet(t, "a", stored(oid(1), dt(1000), true, 1.0), stored(oid(3), dt(3000), true, 3.0)))
	if f == nil || f.Skipped() != 2 {
		t.Fatalf("filter: %+v", f)
	}
	reply := mustDoc(t, bson.D{{Key: "n", Value: int32(1)}, {Key: "writeErrors", Value: bson.A{
		bson.D{{Key: "index", Value: int32(1)}, {Key: "code", Value: int32(2)}, {Key: "errmsg", Value: "bad"}}}}, {Key: "ok", Value: 1.0}})
	assertDoc(t, "mapped reply", f.MapReply(reply), bson.D{{Key: "n", Value: int32(3)}, {Key: "writeErrors", Value: bson.A{
		bson.D{{Key: "index", Value: int32(3)}, {Key: "code", Value: int32(2)}, {Key: "errmsg", Value: "bad"}}}}, {Key: "ok", Value: 1.0}})

	all := WithoutStored(bodyCmd(t, batch[:1]), rule, storedSet(t, "a", stored(oid(1), dt(1000), true, 1.0)))
	if all == nil || !all.AllStored() {
		t.Fatalf("all stored: %+v", all)
	}
	assertDoc(t, "all stored reply", all.AllStoredReply(), bson.D{{Key: "n", Value: int32(1)}, {Key: "ok", Value: 1.0}})
}
