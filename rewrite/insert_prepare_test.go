package rewrite

import (
	"bytes"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestPrepareInsertPlan: preparing (before the keys are locked) and then
// planning gives the commands, keys and reply Insert gives, in every case
// that makes prepareEvents skip or reject events: missing _ids (added in
// the shared buffer), refused events between good ones, the meta field at
// any position or absent, a non-numeric aggregate, ordered and unordered.
func TestPrepareInsertPlan(t *testing.T) {
	evs := []bson.D{
		ev(nil, dt(1), "a", 1.5),  // _id added
		ev(oid(1), dt(2), "b", 2), // int aggregate
		ev(oid(2), nil, "a", 1.0), // no timeField: refused
		{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: dt(3)}, {Key: "value", Value: 3.0}}, // meta first, _id added
		ev(oid(3), dt(4), nil, nil),   // no meta: null series
		ev(oid(4), dt(5), "b", "x"),   // non-numeric aggregate: refused
		ev(nil, dt(hour+1), "a", 4.0), // next window
		{{Key: "_id", Value: oid(5)}, {Key: "ts", Value: dt(6)}, {Key: "sensorId", Value: bson.D{{Key: "k", Value: 1}}}, {Key: "value", Value: int64(7)}},
	}
	for _, ordered := range []bool{true, false} {
		for name, cmd := range map[string]Command{
			"body":     bodyCmd(t, evs, bson.E{Key: "ordered", Value: ordered}),
			"sequence": seqCmd(t, evs, bson.E{Key: "ordered", Value: ordered}),
		} {
			t.Run(fmt.Sprintf("%s ordered=%v", name, ordered), func(t *testing.T) {
				rule := testRule()
				want := mustInsert(t, cmd, rule, opts())
				pi, err := PrepareInsert(cmd, rule, idGen())
				if err != nil {
					t.Fatalf("PrepareInsert: %v", err)
				}
				got := pi.Plan(InsertOptions{NewObjectID: func() bson.ObjectID { t.Fatal("Plan made an _id"); return bson.ObjectID{} }})
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
					if compareKeys(pi.Keys()[i-1], pi.Keys()[i]) >= 0 {
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
	rule := testRule()
	if _, err := PrepareInsert(Command{Body: mustDoc(t, bson.D{{Key: "insert", Value: "other"}, {Key: "documents", Value: bson.A{}}})}, rule, idGen()); err == nil {
		t.Fatal("insert into another collection accepted")
	}
	if _, err := PrepareInsert(bodyCmd(t, []bson.D{ev(oid(1), dt(1), "a", 1.0)}), rule, nil); err == nil {
		t.Fatal("nil NewObjectID accepted")
	}
}
