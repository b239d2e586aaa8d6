package insert

import (
	"bytes"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// replyPlan: events 0-2 (series A) make a complete bucket inserted by
// command 0; events 3 (B) and 4 (C) are upserts 0 and 1 of command 1.
func replyPlan(t testing.TB, extra ...bson.E) *Commands {
	events := []bson.D{
		rwtest.Event(rwtest.OID(1), rwtest.DT(1), "A", nil), rwtest.Event(rwtest.OID(2), rwtest.DT(2), "A", nil), rwtest.Event(rwtest.OID(3), rwtest.DT(3), "A", nil),
		rwtest.Event(rwtest.OID(4), rwtest.DT(4), "B", nil), rwtest.Event(rwtest.OID(5), rwtest.DT(5), "C", nil),
	}
	p := mustInsert(t, rwtest.BodyCmd(t, events, extra...), rwtest.InsertRule(), opts())
	if len(p.Commands) != 2 {
		t.Fatalf("want 2 commands, got %d", len(p.Commands))
	}
	return p
}

func upReply(t testing.TB, n int32, writeErrors bson.A, more ...bson.E) bsoncore.Document {
	d := bson.D{{Key: "n", Value: n}}
	if writeErrors != nil {
		d = append(d, bson.E{Key: "writeErrors", Value: writeErrors})
	}
	d = append(d, more...)
	return rwtest.Doc(t, append(d, bson.E{Key: "ok", Value: 1.0}))
}

func upErr(index, code int32, msg string) bson.D {
	return bson.D{{Key: "index", Value: index}, {Key: "code", Value: code}, {Key: "errmsg", Value: msg}}
}

func TestInsertReply(t *testing.T) {
	lsid := bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}}
	txn := bson.E{Key: "txnNumber", Value: int64(1)}
	unordered := bson.E{Key: "ordered", Value: false}
	wce := bson.D{{Key: "code", Value: int32(64)}, {Key: "errmsg", Value: "waiting for replication timed out"}}
	const dup = "E11000 duplicate key error collection: iot.readings.buckets index: _id_"
	const notRun = "tsproxy rule iot.readings: event not written: an earlier bucket write of this batch failed: "
	cmdErr := bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "not authorized"}, {Key: "code", Value: int32(13)}, {Key: "codeName", Value: "Unauthorized"}}

	tests := []struct {
		name    string
		extra   []bson.E
		replies func(t testing.TB) []bsoncore.Document
		cont    []bool // Continue after each reply
		want    bson.D
	}{
		{
			name: "all ok",
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 1, nil), upReply(t, 2, nil)}
			},
			cont: []bool{true, false},
			want: reply(5),
		},
		{
			name: "ordered update fails on its last statement",
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 1, nil), upReply(t, 1, bson.A{upErr(1, 2, "bad update")})}
			},
			cont: []bool{true, false},
			want: reply(4, we{4, 2, "bad update"}),
		},
		{
			name: "ordered update fails on its first statement: the second is not run",
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 1, nil), upReply(t, 0, bson.A{upErr(0, 2, "bad update")})}
			},
			cont: []bool{true, false},
			want: reply(3, we{3, 2, "bad update"}, we{4, 2, notRun + "bad update"}),
		},
		{
			name: "ordered insert fails: update not run, its events reported",
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 0, bson.A{upErr(0, 11000, dup)})}
			},
			cont: []bool{false},
			want: reply(0, we{0, 11000, dup}, we{1, 11000, dup}, we{2, 11000, dup}, we{3, 11000, notRun + dup}, we{4, 11000, notRun + dup}),
		},
		{
			name:  "unordered insert fails: update still runs",
			extra: []bson.E{unordered},
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 0, bson.A{upErr(0, 2, "no")}), upReply(t, 2, nil)}
			},
			cont: []bool{true, false},
			want: reply(2, we{0, 2, "no"}, we{1, 2, "no"}, we{2, 2, "no"}),
		},
		{
			name:  "duplicate key not retried (unordered) is reported on its events",
			extra: []bson.E{lsid, txn, unordered},
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 0, bson.A{upErr(0, 11000, dup)}), upReply(t, 2, nil)}
			},
			cont: []bool{true, false},
			want: reply(2, we{0, 11000, dup}, we{1, 11000, dup}, we{2, 11000, dup}),
		},
		{
			name: "writeConcernError passed through",
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 1, nil), upReply(t, 2, nil, bson.E{Key: "writeConcernError", Value: wce})}
			},
			cont: []bool{true, false},
			want: bson.D{{Key: "n", Value: int32(5)}, {Key: "writeConcernError", Value: wce}, {Key: "ok", Value: 1.0}},
		},
		{
			name:    "command error before anything was written is the reply",
			replies: func(t testing.TB) []bsoncore.Document { return []bsoncore.Document{rwtest.Doc(t, cmdErr)} },
			cont:    []bool{false},
			want:    cmdErr,
		},
		{
			name: "command error after events were written: per-event errors",
			replies: func(t testing.TB) []bsoncore.Document {
				return []bsoncore.Document{upReply(t, 1, nil), rwtest.Doc(t, cmdErr)}
			},
			cont: []bool{true, false},
			want: reply(3, we{3, 13, "not authorized"}, we{4, 13, "not authorized"}),
		},
		{
			name:    "transport error: outcome unknown, events reported",
			replies: func(t testing.TB) []bsoncore.Document { return []bsoncore.Document{upReply(t, 1, nil), nil} },
			cont:    []bool{true, false},
			want: reply(3,
				we{3, 6, "tsproxy rule iot.readings: no reply from the upstream for this write (it may or may not have been applied)"},
				we{4, 6, "tsproxy rule iot.readings: no reply from the upstream for this write (it may or may not have been applied)"}),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := replyPlan(t, tc.extra...)
			replies := tc.replies(t)
			for i, r := range replies {
				if got := p.Continue(i, r); got != tc.cont[i] {
					t.Errorf("Continue(%d) = %v, want %v", i, got, tc.cont[i])
				}
			}
			rwtest.AssertDoc(t, "reply", p.Reply(replies), tc.want)
		})
	}
}

func TestInsertDeterministic(t *testing.T) {
	var events []bson.D
	for i := range 500 {
		meta := []any{"a", int32(1), nil, bson.D{{Key: "k", Value: "v"}}}[i%4]
		events = append(events, rwtest.Event(nil, rwtest.DT(int64(i*i*997)%(5*rwtest.Hour)-rwtest.Hour), meta, float64(i)/3))
	}
	extra := []bson.E{{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}}, {Key: "txnNumber", Value: int64(3)}}
	rule := rwtest.InsertRule()
	rule.MaxEvents = 7
	o := Options{Caps: caps.Upstream{StmtIDs: true}}
	o.NewObjectID = idGen()
	first := mustInsert(t, rwtest.BodyCmd(t, events, extra...), rule, o)
	o.NewObjectID = idGen()
	second := mustInsert(t, rwtest.SeqCmd(t, events, extra...), rule, o)
	if len(first.Commands) != len(second.Commands) {
		t.Fatalf("%d vs %d commands", len(first.Commands), len(second.Commands))
	}
	for i := range first.Commands {
		if !bytes.Equal(first.Commands[i], second.Commands[i]) {
			t.Errorf("command %d differs between identical inserts", i)
		}
	}
	// Every event is in exactly one statement, and stmtIds are distinct.
	seen := map[int]bool{}
	for _, pc := range first.upstream {
		for _, st := range pc.statements {
			for _, idx := range st.events {
				if seen[idx] {
					t.Errorf("event %d in two statements", idx)
				}
				seen[idx] = true
			}
		}
	}
	if len(seen) != len(events) {
		t.Errorf("%d events planned, want %d", len(seen), len(events))
	}
	rwtest.AssertDoc(t, "reply", first.Reply(okReplies(t, first)), reply(500))
}

func TestInsertSplitsLargeBatches(t *testing.T) {
	smallCommands := opts()
	smallCommands.MaxCommandBytes = 300
	rule := rwtest.InsertRule()
	rule.InsertThreshold = 100
	var events []bson.D
	for i := range 6 {
		events = append(events, rwtest.Event(rwtest.OID(byte(i)), rwtest.DT(int64(i)), []string{"a", "b", "c", "d", "e", "f"}[i], nil))
	}
	p := mustInsert(t, rwtest.BodyCmd(t, events, bson.E{Key: "startTransaction", Value: true}), rule, smallCommands)
	if len(p.Commands) < 2 {
		t.Fatalf("want the updates spread over several commands, got %d", len(p.Commands))
	}
	total := 0
	for i, c := range p.Commands {
		vals, _ := bsoncore.Document(c).Lookup("updates").Array().Values()
		total += len(vals)
		_, hasStart := bsonutil.Lookup(c, "startTransaction")
		if hasStart != (i == 0) {
			t.Errorf("command %d: startTransaction present = %v", i, hasStart)
		}
	}
	if total != 6 {
		t.Errorf("%d statements over all commands, want 6", total)
	}
	rwtest.AssertDoc(t, "reply", p.Reply(okReplies(t, p)), reply(6))
}
