package insert

import (
	"testing"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestMayBeUnseenRetry(t *testing.T) {
	evs := []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1000), "a", 1.0)}
	txn := bson.E{Key: "txnNumber", Value: int64(3)}
	cases := []struct {
		name string
		cmd  rewrite.Command
		caps caps.Upstream
		want bool
	}{
		{"retryable on FerretDB", rwtest.BodyCmd(t, evs, txn), caps.Upstream{IDOnlyFilters: true}, true},
		{"no txnNumber", rwtest.BodyCmd(t, evs), caps.Upstream{}, false},
		{"upstream dedups (MongoDB)", rwtest.BodyCmd(t, evs, txn), caps.Upstream{StmtIDs: true}, false},
		{"transaction statement", rwtest.BodyCmd(t, evs, txn, bson.E{Key: "autocommit", Value: false}), caps.Upstream{}, false},
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
	StoredEventIdentities(bson.Raw(rwtest.Doc(t, bson.D{{Key: "_id", Value: rwtest.OID(9)}, {Key: "meta", Value: meta}, {Key: "events", Value: arr}})), rwtest.InsertRule(), set)
	return set
}

func TestWithoutStored(t *testing.T) {
	rule := rwtest.InsertRule()
	e0 := rwtest.Event(rwtest.OID(1), rwtest.DT(1000), "a", 1.0)
	e1 := rwtest.Event(rwtest.OID(2), rwtest.DT(2000), "a", 2.0)
	e2 := rwtest.Event(rwtest.OID(3), rwtest.DT(3000), "b", 3.0)
	noMeta := rwtest.Event(rwtest.OID(4), rwtest.DT(4000), nil, 4.0)
	batch := []bson.D{e0, e1, e2, noMeta}
	cases := []struct {
		name    string
		stored  map[string]bool
		keep    []bson.D // nil: no filter
		allDone bool
	}{
		{"nothing stored", storedSet(t, "a"), nil, false},
		{"first two stored", storedSet(t, "a", rwtest.Stored(rwtest.OID(1), rwtest.DT(1000), true, 1.0), rwtest.Stored(rwtest.OID(2), rwtest.DT(2000), true, 2.0)), []bson.D{e2, noMeta}, false},
		// Same _id, other series: a different event, kept.
		{"same _id other series", storedSet(t, "b", rwtest.Stored(rwtest.OID(1), rwtest.DT(1000), true, 1.0)), nil, false},
		// Same _id and series, other time: a different event, kept.
		{"same _id other time", storedSet(t, "a", rwtest.Stored(rwtest.OID(1), rwtest.DT(1001), true, 1.0)), nil, false},
		{"null meta matches a missing one", storedSet(t, nil, rwtest.Stored(rwtest.OID(4), rwtest.DT(4000), false, 4.0)), []bson.D{e0, e1, e2}, false},
	}
	for _, c := range cases {
		for _, form := range []struct {
			name string
			mk   func(testing.TB, []bson.D, ...bson.E) rewrite.Command
		}{{"body", rwtest.BodyCmd}, {"sequence", rwtest.SeqCmd}} {
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
			rwtest.AssertDoc(t, c.name+" body", f.Command.Body, bson.Raw(want.Body))
			if form.name == "sequence" {
				got, w := f.Command.Sequences[0].Documents, want.Sequences[0].Documents
				if len(got) != len(w) {
					t.Fatalf("%s: %d documents, want %d", c.name, len(got), len(w))
				}
				for i := range got {
					rwtest.AssertDoc(t, c.name+" doc", got[i], bson.Raw(w[i]))
				}
			}
			if f.AllStored() != c.allDone || f.Skipped() != len(batch)-len(c.keep) {
				t.Errorf("%s: skipped %d, all %v", c.name, f.Skipped(), f.AllStored())
			}
		}
	}
}

func TestReplayFilterReplies(t *testing.T) {
	rule := rwtest.InsertRule()
	batch := []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1000), "a", 1.0), rwtest.Event(rwtest.OID(2), rwtest.DT(2000), "a", 2.0), rwtest.Event(rwtest.OID(3), rwtest.DT(3000), "a", 3.0), rwtest.Event(rwtest.OID(4), rwtest.DT(4000), "a", 4.0)}
	// Events 0 and 2 stored: the filtered insert is [1, 3].
	f := WithoutStored(rwtest.BodyCmd(t, batch), rule, storedSet(t, "a", rwtest.Stored(rwtest.OID(1), rwtest.DT(1000), true, 1.0), rwtest.Stored(rwtest.OID(3), rwtest.DT(3000), true, 3.0)))
	if f == nil || f.Skipped() != 2 {
		t.Fatalf("filter: %+v", f)
	}
	reply := rwtest.Doc(t, bson.D{{Key: "n", Value: int32(1)}, {Key: "writeErrors", Value: bson.A{
		bson.D{{Key: "index", Value: int32(1)}, {Key: "code", Value: int32(2)}, {Key: "errmsg", Value: "bad"}}}}, {Key: "ok", Value: 1.0}})
	rwtest.AssertDoc(t, "mapped reply", f.MapReply(reply), bson.D{{Key: "n", Value: int32(3)}, {Key: "writeErrors", Value: bson.A{
		bson.D{{Key: "index", Value: int32(3)}, {Key: "code", Value: int32(2)}, {Key: "errmsg", Value: "bad"}}}}, {Key: "ok", Value: 1.0}})

	all := WithoutStored(rwtest.BodyCmd(t, batch[:1]), rule, storedSet(t, "a", rwtest.Stored(rwtest.OID(1), rwtest.DT(1000), true, 1.0)))
	if all == nil || !all.AllStored() {
		t.Fatalf("all stored: %+v", all)
	}
	rwtest.AssertDoc(t, "all stored reply", all.AllStoredReply(), bson.D{{Key: "n", Value: int32(1)}, {Key: "ok", Value: 1.0}})
}
