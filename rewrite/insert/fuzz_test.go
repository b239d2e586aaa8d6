package insert

import (
	"testing"

	"github.com/tsproxy/tsproxy/wire"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// FuzzInsert: no body, however malformed, makes Insert, Continue or Reply
// panic, and every upstream command produced is valid BSON.
func FuzzInsert(f *testing.F) {
	seed := func(events []bson.D, extra ...bson.E) []byte { return rwtest.BodyCmd(f, events, extra...).Body }
	f.Add(seed([]bson.D{rwtest.Event(nil, rwtest.DT(1), "s", int32(1))}))
	f.Add(seed([]bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(-1), bson.D{{Key: "a", Value: int32(1)}}, 2.5), rwtest.Event(rwtest.OID(2), rwtest.DT(1), nil, int64(3)), rwtest.Event(rwtest.OID(3), "x", nil, nil)},
		bson.E{Key: "ordered", Value: false}, bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
		bson.E{Key: "txnNumber", Value: int64(1)}))
	f.Add(seed([]bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "s", int32(1)), rwtest.Event(rwtest.OID(2), rwtest.DT(2), "s", int32(2)), rwtest.Event(rwtest.OID(3), rwtest.DT(3), "s", int32(3)), rwtest.Event(rwtest.OID(4), rwtest.DT(4), "s", "v")}))
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		// The proxy hands the rewrite only documents wire has validated.
		if wire.ValidateDocument(body) != nil {
			return
		}
		for _, caps := range []caps.Upstream{{}, {StmtIDs: true}} {
			p, err := New(rewrite.Command{Body: body}, rwtest.InsertRule(), Options{Caps: caps, NewObjectID: idGen()})
			if err != nil {
				_ = mongoerr.Reply(err)
				continue
			}
			replies := okReplies(t, p)
			for i, c := range p.Commands {
				if err := bsoncore.Document(c).Validate(); err != nil {
					t.Fatalf("command %d is not valid BSON: %v", i, err)
				}
				if err := wire.ValidateDocument(c); err != nil {
					t.Fatalf("command %d is not deeply valid BSON: %v", i, err)
				}
				_ = p.Continue(i, replies[i])
			}
			for _, r := range []bsoncore.Document{p.Reply(replies), p.Reply(nil), p.Reply([]bsoncore.Document{body})} {
				if err := wire.ValidateDocument(r); err != nil {
					t.Fatalf("reply is not valid BSON: %v", err)
				}
			}
		}
	})
}
