package rewrite_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
)

// TestGossip: the reply the proxy builds for a rewritten command carries
// the latest operationTime and $clusterTime of its upstream replies (a
// causally consistent session advances only from replies); a reply that
// has its own keeps them.
func TestGossip(t *testing.T) {
	doc := func(d bson.D) []byte {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ct := func(ts bson.Timestamp) bson.D {
		return bson.D{{Key: "clusterTime", Value: ts}, {Key: "signature", Value: bson.D{{Key: "keyId", Value: int64(1)}}}}
	}
	var g rewrite.Gossip
	if got := g.AddTo(doc(bson.D{{Key: "ok", Value: 1.0}})); bson.Raw(got).Lookup("operationTime").Type != 0 {
		t.Fatalf("nothing seen, yet %s", bson.Raw(got))
	}
	g.Note(doc(bson.D{{Key: "ok", Value: 1.0}, {Key: "operationTime", Value: bson.Timestamp{T: 100, I: 2}}, {Key: "$clusterTime", Value: ct(bson.Timestamp{T: 100, I: 2})}}))
	g.Note(doc(bson.D{{Key: "ok", Value: 1.0}, {Key: "operationTime", Value: bson.Timestamp{T: 90, I: 9}}, {Key: "$clusterTime", Value: ct(bson.Timestamp{T: 90, I: 9})}}))
	g.Note(doc(bson.D{{Key: "ok", Value: 1.0}})) // FerretDB: neither
	got := bson.Raw(g.AddTo(doc(bson.D{{Key: "n", Value: int32(1)}, {Key: "ok", Value: 1.0}})))
	if ts, i := got.Lookup("operationTime").Timestamp(); ts != 100 || i != 2 {
		t.Fatalf("operationTime %d,%d in %s, want the latest (100, 2)", ts, i, got)
	}
	if ts, _ := got.Lookup("$clusterTime", "clusterTime").Timestamp(); ts != 100 || got.Lookup("$clusterTime", "signature", "keyId").Int64() != 1 {
		t.Fatalf("$clusterTime in %s, want the latest, signature and all", got)
	}
	if n := got.Lookup("n").Int32(); n != 1 {
		t.Fatalf("the reply's own fields changed: %s", got)
	}
	own := bson.Raw(g.AddTo(doc(bson.D{{Key: "ok", Value: 1.0}, {Key: "operationTime", Value: bson.Timestamp{T: 7, I: 1}}, {Key: "$clusterTime", Value: ct(bson.Timestamp{T: 7, I: 1})}})))
	if ts, _ := own.Lookup("operationTime").Timestamp(); ts != 7 {
		t.Fatalf("a reply's own operationTime was replaced: %s", own)
	}
}
