package rewrite_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestRetryKeyOf(t *testing.T) {
	id := bson.Binary{Subtype: 4, Data: []byte("0123456789abcdef")}
	other := bson.Binary{Subtype: 4, Data: []byte("fedcba9876543210")}
	uidA := bson.Binary{Data: []byte("user-a-sha256")}
	uidB := bson.Binary{Data: []byte("user-b-sha256")}
	lsid := func(fields ...bson.E) bson.E { return bson.E{Key: "lsid", Value: bson.D(fields)} }
	insert := bson.E{Key: "insert", Value: "readings"}
	txn := func(v any) bson.E { return bson.E{Key: "txnNumber", Value: v} }
	cases := []struct {
		name    string
		body    bson.D
		ok      bool
		txn     int64
		errCode mongoerr.Code // 0: no error
		errHas  string        // part of the error message
	}{
		{"retryable", bson.D{insert, lsid(bson.E{Key: "id", Value: id}), txn(int64(7))}, true, 7, 0, ""},
		{"int32 txnNumber", bson.D{insert, lsid(bson.E{Key: "id", Value: id}), txn(int32(3))}, true, 3, 0, ""},
		{"with uid", bson.D{insert, lsid(bson.E{Key: "id", Value: id}, bson.E{Key: "uid", Value: uidA}), txn(int64(7))}, true, 7, 0, ""},
		{"no txnNumber: not retryable", bson.D{insert, lsid(bson.E{Key: "id", Value: id})}, false, 0, 0, ""},
		{"no session at all", bson.D{insert}, false, 0, 0, ""},
		{"transaction statement", bson.D{insert, lsid(bson.E{Key: "id", Value: id}), txn(int64(7)), {Key: "autocommit", Value: false}}, false, 0, 0, ""},
		{"txnNumber without lsid", bson.D{insert, txn(int64(7))}, false, 0, mongoerr.InvalidOptions, "requires a session ID"},
		{"negative txnNumber", bson.D{insert, lsid(bson.E{Key: "id", Value: id}), txn(int64(-1))}, false, 0, mongoerr.InvalidOptions, "non-negative"},
		{"string txnNumber", bson.D{insert, lsid(bson.E{Key: "id", Value: id}), txn("7")}, false, 0, mongoerr.InvalidOptions, "txnNumber"},
		{"lsid not a document", bson.D{insert, {Key: "lsid", Value: "x"}, txn(int64(1))}, false, 0, mongoerr.InvalidOptions, "lsid must be a document"},
		{"lsid without id", bson.D{insert, lsid(bson.E{Key: "uid", Value: uidA}), txn(int64(1))}, false, 0, mongoerr.InvalidOptions, "lsid has no id"},
		{"lsid.id not binary", bson.D{insert, lsid(bson.E{Key: "id", Value: "abc"}), txn(int64(1))}, false, 0, mongoerr.InvalidOptions, "lsid.id must be binary"},
		{"lsid.uid not binary", bson.D{insert, lsid(bson.E{Key: "id", Value: id}, bson.E{Key: "uid", Value: 5}), txn(int64(1))}, false, 0, mongoerr.InvalidOptions, "lsid.uid must be binary"},
	}
	for _, c := range cases {
		key, ok, err := rewrite.RetryKeyOf(rwtest.Doc(t, c.body))
		if c.errCode != 0 {
			var ce *mongoerr.Error
			if !errors.As(err, &ce) || ce.Code != c.errCode || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("%s: error %v, want code %d with %q", c.name, err, c.errCode, c.errHas)
			}
			continue
		}
		if err != nil || ok != c.ok || key.TxnNumber != c.txn {
			t.Errorf("%s: got %+v %v %v, want ok %v txn %d", c.name, key, ok, err, c.ok, c.txn)
		}
	}

	// Sessions: the same lsid gives the same session whatever the
	// txnNumber; another id, or another uid, or a uid against none, gives
	// another one.
	session := func(fields ...bson.E) string {
		k, ok, err := rewrite.RetryKeyOf(rwtest.Doc(t, bson.D{insert, lsid(fields...), txn(int64(1))}))
		if !ok || err != nil {
			t.Fatalf("%v: %v %v", fields, ok, err)
		}
		return k.Session
	}
	plain := session(bson.E{Key: "id", Value: id})
	k2, _, _ := rewrite.RetryKeyOf(rwtest.Doc(t, bson.D{insert, lsid(bson.E{Key: "id", Value: id}), txn(int64(9))}))
	if k2.Session != plain {
		t.Error("one lsid, two txnNumbers: two sessions")
	}
	distinct := map[string]string{
		"id":           plain,
		"other id":     session(bson.E{Key: "id", Value: other}),
		"id+uid A":     session(bson.E{Key: "id", Value: id}, bson.E{Key: "uid", Value: uidA}),
		"id+uid B":     session(bson.E{Key: "id", Value: id}, bson.E{Key: "uid", Value: uidB}),
		"id+empty uid": session(bson.E{Key: "id", Value: id}, bson.E{Key: "uid", Value: bson.Binary{}}),
		// An id whose bytes are another key's id and uid run together.
		"long id": session(bson.E{Key: "id", Value: bson.Binary{Subtype: 4, Data: append([]byte("0123456789abcdef\x01"), uidA.Data...)}}),
	}
	// The key's bytes are kept across versions: a staged write's derived
	// _ids (stage.DerivedID) are made from them, and a retry that reaches a
	// newer proxy must meet its first attempt's ids.
	if want := "16:0123456789abcdef\x00"; plain != want {
		t.Errorf("session key %q, want %q", plain, want)
	}
	if want := "16:0123456789abcdef\x01" + string(uidA.Data); distinct["id+uid A"] != want {
		t.Errorf("session key with uid %q, want %q", distinct["id+uid A"], want)
	}
	seen := map[string]string{}
	for name, s := range distinct {
		if prev, dup := seen[s]; dup {
			t.Errorf("%s and %s share a session key", name, prev)
		}
		seen[s] = name
	}
	if got := k2.SessionHex(); got != "30313233343536373839616263646566" {
		t.Errorf("SessionHex = %s", got)
	}
}

func TestReplyRecordable(t *testing.T) {
	cases := []struct {
		name  string
		reply bson.D
		want  bool
	}{
		{"ok", bson.D{{Key: "n", Value: 3}, {Key: "ok", Value: 1.0}}, true},
		{"ok int", bson.D{{Key: "n", Value: 3}, {Key: "ok", Value: int32(1)}}, true},
		{"write errors", bson.D{{Key: "n", Value: 1}, {Key: "writeErrors", Value: bson.A{bson.D{{Key: "index", Value: 1}}}}, {Key: "ok", Value: 1.0}}, true},
		{"write concern error", bson.D{{Key: "n", Value: 3}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: 64}}}, {Key: "ok", Value: 1.0}}, true},
		{"command failed", bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 9}}, false},
		{"no ok", bson.D{{Key: "n", Value: 3}}, false},
	}
	for _, c := range cases {
		if got := rewrite.ReplyRecordable(rwtest.Doc(t, c.reply)); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	if rewrite.ReplyRecordable([]byte{1, 2}) {
		t.Error("malformed reply recordable")
	}
}

func TestTransactionTooOld(t *testing.T) {
	k, _, _ := rewrite.RetryKeyOf(rwtest.Doc(t, bson.D{{Key: "insert", Value: "x"},
		{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte{0xab, 0xcd}}}}}, {Key: "txnNumber", Value: int64(4)}}))
	err := rewrite.TransactionTooOld(k, 6)
	reply := bson.Raw(mongoerr.Reply(err))
	if code, _ := reply.Lookup("code").AsInt64OK(); code != 225 || reply.Lookup("codeName").StringValue() != "TransactionTooOld" {
		t.Fatalf("reply %s", reply)
	}
	if msg := reply.Lookup("errmsg").StringValue(); !strings.Contains(msg, "txnNumber 4") || !strings.Contains(msg, "txnNumber 6") || !strings.Contains(msg, "abcd") {
		t.Fatalf("message %q", msg)
	}
}

// FuzzRetryKeyOf: any command body gives a key, no key, or an error, and
// never a panic; a key names a non-negative txnNumber.
func FuzzRetryKeyOf(f *testing.F) {
	for _, d := range []bson.D{
		{{Key: "insert", Value: "c"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte("0123456789abcdef")}}}}, {Key: "txnNumber", Value: int64(1)}},
		{{Key: "insert", Value: "c"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: []byte("x")}}, {Key: "uid", Value: bson.Binary{Data: []byte("u")}}}}, {Key: "txnNumber", Value: int32(2)}},
		{{Key: "delete", Value: "c"}, {Key: "txnNumber", Value: int64(1)}},
	} {
		b, err := bson.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		key, ok, err := rewrite.RetryKeyOf(body)
		if ok && (err != nil || key.TxnNumber < 0 || key.Session == "") {
			t.Fatalf("key %+v with err %v", key, err)
		}
		if err != nil && ok {
			t.Fatal("a key and an error")
		}
	})
}
