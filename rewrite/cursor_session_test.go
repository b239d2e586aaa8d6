package rewrite

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestCursorSession(t *testing.T) {
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	marshal := func(d bson.D) []byte {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	getMore := marshal(bson.D{{Key: "getMore", Value: int64(7)}, {Key: "collection", Value: "b"}, {Key: "$db", Value: "db"}})
	for _, c := range []struct {
		name   string
		client bson.D
		body   []byte
		want   []string // the fields the body gets, in order, after its own
	}{
		{"no session", bson.D{{Key: "find", Value: "x"}}, getMore, nil},
		{"lsid", bson.D{{Key: "find", Value: "x"}, {Key: "lsid", Value: lsid}}, getMore, []string{"lsid"}},
		{"a retryable write's txnNumber stays out", bson.D{{Key: "delete", Value: "x"}, {Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(3)}}, getMore, []string{"lsid"}},
		{"a transaction's fields go in", bson.D{{Key: "find", Value: "x"}, {Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(3)}, {Key: "autocommit", Value: false}}, getMore, []string{"lsid", "txnNumber", "autocommit"}},
		{"killCursors", bson.D{{Key: "find", Value: "x"}, {Key: "lsid", Value: lsid}}, marshal(bson.D{{Key: "killCursors", Value: "b"}, {Key: "cursors", Value: bson.A{int64(7)}}, {Key: "$db", Value: "db"}}), []string{"lsid"}},
		{"other commands untouched", bson.D{{Key: "find", Value: "x"}, {Key: "lsid", Value: lsid}}, marshal(bson.D{{Key: "find", Value: "b"}, {Key: "$db", Value: "db"}}), nil},
		{"a getMore with its own lsid untouched", bson.D{{Key: "find", Value: "x"}, {Key: "lsid", Value: lsid}}, marshal(bson.D{{Key: "getMore", Value: int64(7)}, {Key: "lsid", Value: lsid}, {Key: "$db", Value: "db"}}), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, changed := ReadCursorSession(marshal(c.client)).AddTo(c.body)
			if changed != (c.want != nil) {
				t.Fatalf("changed %v, want %v", changed, c.want != nil)
			}
			before, _ := bson.Raw(c.body).Elements()
			after, err := bson.Raw(got).Elements()
			if err != nil {
				t.Fatal(err)
			}
			var added []string
			for _, e := range after[len(before):] {
				added = append(added, e.Key())
			}
			if len(added) != len(c.want) {
				t.Fatalf("added %v, want %v", added, c.want)
			}
			for i := range added {
				if added[i] != c.want[i] {
					t.Fatalf("added %v, want %v", added, c.want)
				}
			}
		})
	}
}
