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

// TestCursorSessions: a getMore carries the client's session unless its
// cursor was opened in this run by a command without one; a release
// keeps the session of the read that opened its cursor.
func TestCursorSessions(t *testing.T) {
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	m := func(d bson.D) []byte {
		b, err := bson.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	opened := func(id int64) []byte {
		return m(bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: id}, {Key: "firstBatch", Value: bson.A{}}}}, {Key: "ok", Value: 1.0}})
	}
	getMore := func(id int64) Step {
		return Step{{Body: m(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "b"}, {Key: "$db", Value: "db"}})}}
	}
	hasLsid := func(s Step) bool { _, err := bson.Raw(s[0].Body).LookupErr("lsid"); return err == nil }

	c := NewCursorSessions(m(bson.D{{Key: "find", Value: "x"}, {Key: "lsid", Value: lsid}}))
	c.Note(Step{{Body: m(bson.D{{Key: "find", Value: "b"}, {Key: "$db", Value: "db"}})}}, [][]byte{opened(5)})
	c.Note(Step{{Body: m(bson.D{{Key: "find", Value: "b"}, {Key: "lsid", Value: lsid}, {Key: "$db", Value: "db"}})}}, [][]byte{opened(6)})
	if hasLsid(c.Prepare(getMore(5))) {
		t.Error("a cursor opened without a session got the client's on its getMore")
	}
	if !hasLsid(c.Prepare(getMore(6))) {
		t.Error("a cursor opened in the client's session lost it on its getMore")
	}
	if !hasLsid(c.Prepare(getMore(7))) {
		t.Error("a cursor opened before this run (a rewritten read's) got no session")
	}
	if hasLsid(NewCursorSessions(m(bson.D{{Key: "find", Value: "x"}})).Prepare(getMore(7))) {
		t.Error("a client without a session gave one")
	}

	body := m(bson.D{{Key: "find", Value: "x"}, {Key: "lsid", Value: lsid}})
	kept := ReadCursorSession(body).Clone()
	for i := range body {
		body[i] = 0 // the command's buffer, reused
	}
	kill := Step{{Body: m(bson.D{{Key: "killCursors", Value: "b"}, {Key: "cursors", Value: bson.A{int64(9)}}, {Key: "$db", Value: "db"}})}}
	if !hasLsid(SessionsOf(kept).Prepare(kill)) {
		t.Error("a release lost the session of the read that opened its cursor")
	}
}
