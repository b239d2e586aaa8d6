package tier

import (
	"errors"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// listRunner answers listCollections with collections named, counting
// the listings; fail, when set, fails the next one.
type listRunner struct {
	t     *testing.T
	names []string
	n     int
	fail  error
}

func (l *listRunner) RunStep(step rewrite.Step) ([][]byte, error) {
	l.n++
	if l.fail != nil {
		err := l.fail
		l.fail = nil
		return nil, err
	}
	return [][]byte{listReply(l.t, "iot", l.names...)}, nil
}

// listReply is a one-batch listCollections reply of db naming names.
func listReply(t *testing.T, db string, names ...string) []byte {
	var batch bson.A
	for _, n := range names {
		batch = append(batch, bson.D{{Key: "name", Value: n}, {Key: "type", Value: "collection"}})
	}
	return doc(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: db + ".$cmd.listCollections"}, {Key: "firstBatch", Value: batch}}}, {Key: "ok", Value: 1.0}})
}

// TestDBListingsShared: the rules of one database share a listing for
// listingShared, each reading its own work from it; another database, a
// later round and a failed listing list again.
func TestDBListingsShared(t *testing.T) {
	rule := func(coll string) *rules.Rule {
		return &rules.Rule{Namespace: "iot." + coll, DB: "iot", Collection: coll, TimeField: "ts", Span: time.Hour,
			BucketCollection: coll + ".buckets", Layout: rules.LayoutEvents}
	}
	a, b := rule("a"), rule("b")
	other := rule("c")
	other.DB, other.Namespace = "farm", "farm.c"
	r := &listRunner{t: t, names: []string{"a.buckets", stage.OpenCollection(a, 0, stage.Stager{})}}
	l := newDBListings()
	t0 := time.Unix(1000, 0)
	check := func(rule *rules.Rule, at time.Duration, wantWork bool, wantListings int) {
		t.Helper()
		_, work, err := l.stagedWork(r, rule, t0.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		if work != wantWork || r.n != wantListings {
			t.Fatalf("%s at %v: work %v after %d listings, want %v after %d", rule.Namespace, at, work, r.n, wantWork, wantListings)
		}
	}
	check(a, 0, true, 1)
	check(b, 100*time.Millisecond, false, 1) // a's listing: b has nothing staged
	check(a, 200*time.Millisecond, true, 1)
	check(other, 200*time.Millisecond, false, 2) // another database lists its own
	check(b, listingShared, false, 3)            // too old: listed again
	r.fail = errors.New("connection reset")
	if _, _, err := l.stagedWork(r, a, t0.Add(2*listingShared)); err == nil {
		t.Fatal("a failed listing answered")
	}
	check(a, 2*listingShared+time.Millisecond, true, 5) // the failure was not kept
}

func doc(t *testing.T, d bson.D) []byte {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
