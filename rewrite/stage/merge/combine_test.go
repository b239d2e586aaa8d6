package merge_test

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

func TestSplitReply(t *testing.T) {
	doc := func(d bson.D) []byte { return rwtest.Doc(t, d) }
	we := func(index int32, code int32) bson.D {
		return bson.D{{Key: "index", Value: index}, {Key: "code", Value: code}, {Key: "errmsg", Value: "E11000 duplicate key"}}
	}
	cases := []struct {
		name  string
		reply []byte
		sizes []int
		want  []string
	}{
		{"all stored", doc(bson.D{{Key: "n", Value: int32(6)}, {Key: "ok", Value: 1.0}}), []int{1, 2, 3},
			[]string{`{"n": {"$numberInt":"1"},"ok": {"$numberDouble":"1.0"}}`, `{"n": {"$numberInt":"2"},"ok": {"$numberDouble":"1.0"}}`, `{"n": {"$numberInt":"3"},"ok": {"$numberDouble":"1.0"}}`}},
		{"errors go to their part, re-indexed", doc(bson.D{{Key: "n", Value: int32(3)}, {Key: "writeErrors", Value: bson.A{we(0, 11000), we(3, 11000), we(5, 11000)}}, {Key: "ok", Value: 1.0}}), []int{1, 2, 3},
			[]string{
				`{"n": {"$numberInt":"0"},"writeErrors": [{"index": {"$numberInt":"0"},"code": {"$numberInt":"11000"},"errmsg": "E11000 duplicate key"}],"ok": {"$numberDouble":"1.0"}}`,
				`{"n": {"$numberInt":"2"},"ok": {"$numberDouble":"1.0"}}`,
				`{"n": {"$numberInt":"1"},"writeErrors": [{"index": {"$numberInt":"0"},"code": {"$numberInt":"11000"},"errmsg": "E11000 duplicate key"},{"index": {"$numberInt":"2"},"code": {"$numberInt":"11000"},"errmsg": "E11000 duplicate key"}],"ok": {"$numberDouble":"1.0"}}`,
			}},
		{"a write concern error is everyone's", doc(bson.D{{Key: "n", Value: int32(2)}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: int32(64)}}}, {Key: "ok", Value: 1.0}}), []int{1, 1},
			[]string{`{"n": {"$numberInt":"1"},"writeConcernError": {"code": {"$numberInt":"64"}},"ok": {"$numberDouble":"1.0"}}`, `{"n": {"$numberInt":"1"},"writeConcernError": {"code": {"$numberInt":"64"}},"ok": {"$numberDouble":"1.0"}}`}},
		{"a refusal is everyone's", doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: int32(13)}}), []int{2, 1},
			[]string{`{"ok": {"$numberDouble":"0.0"},"errmsg": "no","code": {"$numberInt":"13"}}`, `{"ok": {"$numberDouble":"0.0"},"errmsg": "no","code": {"$numberInt":"13"}}`}},
	}
	for _, c := range cases {
		got := stage.SplitReply(c.reply, c.sizes)
		for i := range c.want {
			if s := rwtest.JSON(got[i]); s != c.want[i] {
				t.Errorf("%s, part %d:\n got %s\nwant %s", c.name, i, s, c.want[i])
			}
		}
	}
}

// A combinable staged insert goes without the session's fields and is
// marked Combine; the parts of a combined insert are its documents in
// order.
func TestCombinableInsert(t *testing.T) {
	rule := rwtest.InsertRule()
	step := func(env stage.InsertEnv, extra ...bson.E) rewrite.Upstream {
		cmd := rwtest.SeqCmd(t, events("a", 0, 2), extra...)
		pi, err := insert.Prepare(cmd, rule, bson.NewObjectID)
		if err != nil {
			t.Fatal(err)
		}
		env.Identity, env.NewObjectID = "u", bson.NewObjectID
		s, done := stage.Insert(cmd, pi, env).Next()
		if done || len(s) != 1 {
			t.Fatalf("step %v", s)
		}
		return s[0]
	}
	plain := step(stage.InsertEnv{}, retryArgs(1)...)
	if plain.Combine || bson.Raw(plain.Body).Lookup("lsid").Type == 0 {
		t.Fatal("not combinable: the session's fields go with it")
	}
	a := step(stage.InsertEnv{Combinable: true}, retryArgs(1)...)
	b := step(stage.InsertEnv{Combinable: true}, retryArgs(2)...)
	if !a.Combine || bson.Raw(a.Body).Lookup("lsid").Type != 0 || string(a.Body) != string(b.Body) {
		t.Fatalf("combinable inserts of two sessions: %s and %s", bson.Raw(a.Body), bson.Raw(b.Body))
	}
	txn := step(stage.InsertEnv{Combinable: true}, append(retryArgs(3), bson.E{Key: "autocommit", Value: false})...)
	if txn.Combine {
		t.Fatal("an insert in a transaction is never combined")
	}
	both := stage.Combine(a.Body, []*rewrite.Sequence{a.Seq, b.Seq})
	if len(both.Seq.Documents) != len(a.Seq.Documents)+len(b.Seq.Documents) || string(both.Seq.Documents[0]) != string(a.Seq.Documents[0]) {
		t.Fatal("Combine: the parts' documents in order")
	}
}
