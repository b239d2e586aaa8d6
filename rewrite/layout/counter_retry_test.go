package layout

import (
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestCounterWriteID(t *testing.T) {
	lsid := bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: "session-1"}}}
	otherLsid := bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: "session-2"}}}
	txn := func(n int64) bson.E { return bson.E{Key: "txnNumber", Value: n} }
	ev := []bson.D{hit("/a", rwtest.DT(0))}
	id := func(caps caps.Upstream, extra ...bson.E) string {
		return CounterWriteID(rwtest.BodyCmd(t, ev, extra...), caps)
	}
	cases := []struct {
		name string
		got  string
		want string // "" none, "same" equal to base, "other" another non-empty id
	}{
		{"no txnNumber: not retryable", id(caps.Upstream{}, lsid), ""},
		{"upstream with retryable writes recognises retries itself", id(caps.Upstream{StmtIDs: true}, lsid, txn(1)), ""},
		{"transaction statement", id(caps.Upstream{}, lsid, txn(1), bson.E{Key: "autocommit", Value: false}), ""},
		{"same lsid and txnNumber: the same id", id(caps.Upstream{}, lsid, txn(1)), "same"},
		{"another txnNumber", id(caps.Upstream{}, lsid, txn(2)), "other"},
		{"another session", id(caps.Upstream{}, otherLsid, txn(1)), "other"},
	}
	base := id(caps.Upstream{}, lsid, txn(1))
	if len(base) != 24 {
		t.Fatalf("write id %q, want 24 hex digits", base)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			switch tc.want {
			case "":
				if tc.got != "" {
					t.Fatalf("id %q, want none", tc.got)
				}
			case "same":
				if tc.got != base {
					t.Fatalf("id %q, want %q", tc.got, base)
				}
			default:
				if tc.got == "" || tc.got == base {
					t.Fatalf("id %q, want one of its own (base %q)", tc.got, base)
				}
			}
		})
	}
}

// markedStmt is counterStmt with the write's mark for period gen.
func markedStmt(rule *rules.Rule, page any, start int64, slots bson.D, total int64, writeID string, gen int) bson.D {
	s := counterStmt(rule, page, start, slots, total)
	u := s[1].Value.(bson.D)
	u = append(u,
		bson.E{Key: "$set", Value: bson.D{{Key: "applied.g" + string(rune('0'+gen%3)) + "." + writeID, Value: true}}},
		bson.E{Key: "$unset", Value: bson.D{{Key: "applied.g" + string(rune('0'+(gen+1)%3)), Value: ""}}})
	s[1].Value = u
	return s
}

func TestCounterInsertMarks(t *testing.T) {
	rule := layoutRule(rules.LayoutCounter, time.Minute, time.Second)
	const w = "0123456789abcdef01234567"
	life := MarkerLife.Milliseconds()
	events := []bson.D{hit("/b", rwtest.DT(5000)), hit("/a", rwtest.DT(5000)), hit("/b", rwtest.DT(5500)), hit("/c", rwtest.DT(0))}
	idA := bucket.IDOf(rule.BucketNamespace(), rawOf("/a"), 0, 0)
	idB := bucket.IDOf(rule.BucketNamespace(), rawOf("/b"), 0, 0)
	idC := bucket.IDOf(rule.BucketNamespace(), rawOf("/c"), 0, 0)
	stA := func(gen int) bson.D {
		return markedStmt(rule, "/a", 0, bson.D{{Key: "slots.5", Value: int64(1)}}, 1, w, gen)
	}
	stB := func(gen int) bson.D {
		return markedStmt(rule, "/b", 0, bson.D{{Key: "slots.5", Value: int64(2)}}, 2, w, gen)
	}
	stC := func(gen int) bson.D {
		return markedStmt(rule, "/c", 0, bson.D{{Key: "slots.0", Value: int64(1)}}, 1, w, gen)
	}
	cases := []struct {
		name    string
		now     int64
		applied map[[12]byte]bool
		want    []bson.D // the statements of the one command; nil: no command
		buckets [][12]byte
		n       int32
	}{
		{name: "first attempt: every upsert marked, period 0", now: 5, want: []bson.D{stA(0), stB(0), stC(0)}, buckets: [][12]byte{idA, idB, idC}, n: 4},
		{name: "period 1 sets g1 and unsets g2", now: life + 1, want: []bson.D{stA(1), stB(1), stC(1)}, buckets: [][12]byte{idA, idB, idC}, n: 4},
		{name: "period 2 sets g2 and unsets g0", now: 2*life + 1, want: []bson.D{stA(2), stB(2), stC(2)}, buckets: [][12]byte{idA, idB, idC}, n: 4},
		{name: "retry: the applied statement left out, its events counted", now: 5, applied: map[[12]byte]bool{idB: true},
			want: []bson.D{stA(0), stC(0)}, buckets: [][12]byte{idA, idC}, n: 4},
		{name: "retry fully applied: nothing sent, all counted", now: 5, applied: map[[12]byte]bool{idA: true, idB: true, idC: true},
			n: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := CounterOptions{WriteID: w, Now: tc.now}
			if tc.applied != nil {
				opts.Applied = func(id [12]byte) bool { return tc.applied[id] }
			}
			p, err := CounterInsertWith(rwtest.BodyCmd(t, events), rule, opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if len(p.Commands) != 0 {
					t.Fatalf("%d commands, want none", len(p.Commands))
				}
			} else {
				if len(p.Commands) != 1 {
					t.Fatalf("%d commands, want 1", len(p.Commands))
				}
				rwtest.AssertDoc(t, "command", p.Commands[0], rwtest.UpdateCmd(true, tc.want))
			}
			if len(p.Buckets) != len(tc.buckets) {
				t.Fatalf("buckets %x, want %x", p.Buckets, tc.buckets)
			}
			for i := range tc.buckets {
				if p.Buckets[i] != tc.buckets[i] {
					t.Fatalf("buckets %x, want %x", p.Buckets, tc.buckets)
				}
			}
			replies := make([][]byte, len(p.Commands))
			for i := range replies {
				replies[i] = rwtest.Doc(t, bson.D{{Key: "n", Value: len(tc.want)}, {Key: "ok", Value: 1.0}})
			}
			checkLayoutReply(t, p.Reply(replies), tc.n, nil, "")
		})
	}
}

func TestCounterHasMark(t *testing.T) {
	const w = "0123456789abcdef01234567"
	cases := []struct {
		name string
		bdoc bson.D
		want bool
	}{
		{"no marks", bson.D{{Key: "_id", Value: 1}}, false},
		{"marked in the current period", bson.D{{Key: "applied", Value: bson.D{{Key: "g1", Value: bson.D{{Key: w, Value: true}}}}}}, true},
		{"marked in the previous period, among others", bson.D{{Key: "applied", Value: bson.D{
			{Key: "g0", Value: bson.D{{Key: "ffff", Value: true}}},
			{Key: "g2", Value: bson.D{{Key: "eeee", Value: true}, {Key: w, Value: true}}}}}}, true},
		{"other writes only", bson.D{{Key: "applied", Value: bson.D{{Key: "g0", Value: bson.D{{Key: "ffff", Value: true}}}}}}, false},
		{"malformed marks ignored", bson.D{{Key: "applied", Value: bson.D{{Key: "g0", Value: "x"}}}}, false},
		{"marks not a document", bson.D{{Key: "applied", Value: 3}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := CounterHasMark(rwtest.Doc(t, tc.bdoc), w); got != tc.want {
				t.Fatalf("CounterHasMark = %v, want %v", got, tc.want)
			}
		})
	}
	if CounterHasMark(rwtest.Doc(t, cases[1].bdoc), "") {
		t.Fatal("an empty write id matched")
	}
}

func TestCounterRetryTooLate(t *testing.T) {
	err := CounterRetryTooLate("iot.readings", 42*time.Second)
	if !strings.Contains(err.Error(), "42s after its first attempt") || !strings.Contains(bson.Raw(mongoerr.Reply(err)).String(), "InternalError") {
		t.Fatalf("err %v", err)
	}
}
