package insert

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TestPrepareInsertPlan: preparing (before the keys are locked) and then
// planning gives the commands, keys and reply Insert gives, in every case
// that makes prepareEvents skip or reject events: missing _ids (added in
// the shared buffer), refused events between good ones, the meta field at
// any position or absent, a non-numeric aggregate, ordered and unordered.
func TestPrepareInsertPlan(t *testing.T) {
	evs := []bson.D{
		rwtest.Event(nil, rwtest.DT(1), "a", 1.5),                                                     // _id added
		rwtest.Event(rwtest.OID(1), rwtest.DT(2), "b", 2),                                             // int aggregate
		rwtest.Event(rwtest.OID(2), nil, "a", 1.0),                                                    // no timeField: refused
		{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: rwtest.DT(3)}, {Key: "value", Value: 3.0}}, // meta first, _id added
		rwtest.Event(rwtest.OID(3), rwtest.DT(4), nil, nil),                                           // no meta: null series
		rwtest.Event(rwtest.OID(4), rwtest.DT(5), "b", "x"),                                           // non-numeric aggregate: refused
		rwtest.Event(nil, rwtest.DT(rwtest.Hour+1), "a", 4.0),                                         // next window
		{{Key: "_id", Value: rwtest.OID(5)}, {Key: "ts", Value: rwtest.DT(6)}, {Key: "sensorId", Value: bson.D{{Key: "k", Value: 1}}}, {Key: "value", Value: int64(7)}},
	}
	for _, ordered := range []bool{true, false} {
		for name, cmd := range map[string]rewrite.Command{
			"body":     rwtest.BodyCmd(t, evs, bson.E{Key: "ordered", Value: ordered}),
			"sequence": rwtest.SeqCmd(t, evs, bson.E{Key: "ordered", Value: ordered}),
		} {
			t.Run(fmt.Sprintf("%s ordered=%v", name, ordered), func(t *testing.T) {
				rule := rwtest.InsertRule()
				want := mustInsert(t, cmd, rule, opts())
				pi, err := Prepare(cmd, rule, idGen())
				if err != nil {
					t.Fatalf("PrepareInsert: %v", err)
				}
				got := pi.Plan(Options{NewObjectID: func() bson.ObjectID { t.Fatal("Plan made an _id"); return bson.ObjectID{} }})
				if len(got.Commands) != len(want.Commands) || len(got.Commands) == 0 {
					t.Fatalf("%d commands, want %d", len(got.Commands), len(want.Commands))
				}
				for i := range want.Commands {
					if !bytes.Equal(got.Commands[i], want.Commands[i]) {
						t.Fatalf("command %d:\n got %s\nwant %s", i, bson.Raw(got.Commands[i]), bson.Raw(want.Commands[i]))
					}
				}
				if r, w := got.Reply(okReplies(t, got)), want.Reply(okReplies(t, want)); !bytes.Equal(r, w) {
					t.Fatalf("reply %s, want %s", bson.Raw(r), bson.Raw(w))
				}
				wantKeys := 2 // ordered stops at the event without a time: series a and b of window 0
				if !ordered {
					wantKeys = 5 // a, b, null and {k: 1} in window 0, a in window 1
				}
				if len(pi.Keys()) != wantKeys {
					t.Fatalf("%d keys, want %d", len(pi.Keys()), wantKeys)
				}
				for i := 1; i < len(pi.Keys()); i++ {
					if bucket.CompareKeys(pi.Keys()[i-1], pi.Keys()[i]) >= 0 {
						t.Fatalf("keys not sorted and distinct: %v", pi.Keys())
					}
				}
			})
		}
	}
}

// TestPrepareInsertErrors: a malformed insert is refused by PrepareInsert
// as by Insert.
func TestPrepareInsertErrors(t *testing.T) {
	rule := rwtest.InsertRule()
	if _, err := Prepare(rewrite.Command{Body: rwtest.Doc(t, bson.D{{Key: "insert", Value: "other"}, {Key: "documents", Value: bson.A{}}})}, rule, idGen()); err == nil {
		t.Fatal("insert into another collection accepted")
	}
	if _, err := Prepare(rwtest.BodyCmd(t, []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "a", 1.0)}), rule, nil); err == nil {
		t.Fatal("nil NewObjectID accepted")
	}
}

// TestCommandSections: every command splits into its body without the
// statements and the statements themselves, in order, for inserts of
// complete buckets and updates alike.
func TestCommandSections(t *testing.T) {
	var evs []bson.D
	for i := byte(1); i <= 7; i++ { // series a: 3 (a complete bucket) + 3 + 1 (upsert); b: 1 (upsert)
		meta := "a"
		if i == 7 {
			meta = "b"
		}
		evs = append(evs, rwtest.Event(rwtest.OID(i), rwtest.DT(int64(i)), meta, float64(i)))
	}
	p := mustInsert(t, rwtest.SeqCmd(t, evs, bson.E{Key: "ordered", Value: false}), rwtest.InsertRule(), opts())
	kinds := map[string]bool{}
	for i, cmd := range p.Commands {
		body, id, stmts, err := p.CommandSections(i)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		kinds[id] = true
		arr, err := bsoncore.Document(cmd).LookupErr(id)
		if err != nil {
			t.Fatalf("command %d has no %q", i, id)
		}
		want, _ := arr.Array().Values()
		if len(stmts) != len(want) || len(stmts) == 0 {
			t.Fatalf("command %d: %d statements, want %d", i, len(stmts), len(want))
		}
		for j := range want {
			if !bytes.Equal(stmts[j], want[j].Document()) {
				t.Fatalf("command %d statement %d differs", i, j)
			}
		}
		if _, err := bsoncore.Document(body).LookupErr(id); err == nil {
			t.Fatalf("body of command %d still holds %q", i, id)
		}
		wantElems, _ := bsoncore.Document(cmd).Elements()
		gotElems, _ := bsoncore.Document(body).Elements()
		if len(gotElems) != len(wantElems)-1 {
			t.Fatalf("body of command %d has %d fields, want %d", i, len(gotElems), len(wantElems)-1)
		}
		k := 0
		for _, e := range wantElems {
			if e.Key() == id {
				continue
			}
			if !bytes.Equal(gotElems[k], e) {
				t.Fatalf("body of command %d field %d: %s, want %s", i, k, gotElems[k], e)
			}
			k++
		}
	}
	if !kinds["documents"] || !kinds["updates"] {
		t.Fatalf("want an insert and an update, got %v", kinds)
	}
	if _, _, _, err := p.CommandSections(len(p.Commands)); err == nil {
		t.Fatal("no error for a command out of range")
	}
}
