package rollup

import (
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

const minute = int64(60_000)

func rollupRule(res ...time.Duration) *rules.Rule {
	r := rwtest.InsertRule()
	r.Rollups = res
	return r
}

// rid is the rollup _id of meta's series and period start at resolution label.
func rid(label string, meta any, start int64) bson.ObjectID {
	v := bsoncore.Value{Type: bsoncore.TypeNull}
	if meta != nil {
		t, data, _ := bson.MarshalValue(meta)
		v = bsoncore.Value{Type: bsoncore.Type(t), Data: data}
	}
	return ID("iot.readings.rollup_"+label, v, start)
}

func rollupUpsert(label string, meta any, start int64, count int32, sum any, minT, maxT int64, minV, maxV any) bson.D {
	inc := bson.D{{Key: "count", Value: count}}
	mn := bson.D{{Key: "min.ts", Value: rwtest.DT(minT)}}
	mx := bson.D{{Key: "max.ts", Value: rwtest.DT(maxT)}}
	if sum != nil {
		inc = append(inc, bson.E{Key: "sum.value", Value: sum})
		mn = append(mn, bson.E{Key: "min.value", Value: minV})
		mx = append(mx, bson.E{Key: "max.value", Value: maxV})
	}
	return bson.D{
		{Key: "q", Value: bson.D{{Key: "_id", Value: rid(label, meta, start)}}},
		{Key: "u", Value: bson.D{
			{Key: "$set", Value: bson.D{{Key: "meta", Value: meta}, {Key: "start", Value: rwtest.DT(start)}}},
			{Key: "$inc", Value: inc}, {Key: "$min", Value: mn}, {Key: "$max", Value: mx},
		}},
		{Key: "upsert", Value: true},
	}
}

func rollupUpdate(label string, stmts []bson.D, tail ...bson.E) bson.D {
	arr := bson.A{}
	for _, s := range stmts {
		arr = append(arr, s)
	}
	d := bson.D{{Key: "update", Value: "readings.rollup_" + label}, {Key: "updates", Value: arr}, {Key: "ordered", Value: false}}
	d = append(d, tail...)
	return append(d, bson.E{Key: "$db", Value: "iot"})
}

func okReply(n int32, failed ...int32) bson.D {
	d := bson.D{{Key: "n", Value: n}}
	if len(failed) > 0 {
		arr := bson.A{}
		for _, i := range failed {
			arr = append(arr, bson.D{{Key: "index", Value: i}, {Key: "code", Value: int32(11000)}, {Key: "errmsg", Value: "x"}})
		}
		d = append(d, bson.E{Key: "writeErrors", Value: arr})
	}
	return append(d, bson.E{Key: "ok", Value: 1.0})
}

func TestRollups(t *testing.T) {
	base := int64(1_700_000_000_000) / rwtest.Hour * rwtest.Hour // an rwtest.Hour boundary
	cases := []struct {
		name   string
		rule   *rules.Rule
		cmd    func(t *testing.T) rewrite.Command
		reply  bson.D
		opts   Options
		events int
		want   []bson.D
	}{
		{
			name: "one series, one minute: summed into one statement",
			rule: rollupRule(time.Minute),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base+1000), "a", 1.5), rwtest.Event(2, rwtest.DT(base+2000), "a", 2.5), rwtest.Event(3, rwtest.DT(base+3000), "a", int32(7))})
			},
			reply:  okReply(3),
			events: 3,
			want: []bson.D{rollupUpdate("1m", []bson.D{
				rollupUpsert("1m", "a", base, 3, 11.0, base+1000, base+3000, 1.5, int32(7)),
			})},
		},
		{
			name: "two resolutions, two series, two minutes; order of first appearance",
			rule: rollupRule(time.Minute, time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.SeqCmd(t, []bson.D{
					rwtest.Event(1, rwtest.DT(base+minute+5), "b", int32(1)), rwtest.Event(2, rwtest.DT(base+5), "a", int32(2)),
					rwtest.Event(3, rwtest.DT(base+10), "b", int32(3)), rwtest.Event(4, rwtest.DT(base+minute+6), "b", int32(4)),
				})
			},
			reply:  okReply(4),
			events: 4,
			want: []bson.D{
				rollupUpdate("1m", []bson.D{
					rollupUpsert("1m", "b", base+minute, 2, int32(5), base+minute+5, base+minute+6, int32(1), int32(4)),
					rollupUpsert("1m", "a", base, 1, int32(2), base+5, base+5, int32(2), int32(2)),
					rollupUpsert("1m", "b", base, 1, int32(3), base+10, base+10, int32(3), int32(3)),
				}),
				rollupUpdate("1h", []bson.D{
					rollupUpsert("1h", "b", base, 3, int32(8), base+10, base+minute+6, int32(1), int32(4)),
					rollupUpsert("1h", "a", base, 1, int32(2), base+5, base+5, int32(2), int32(2)),
				}),
			},
		},
		{
			name: "write errors and invalid events do not count (unordered)",
			rule: rollupRule(time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{
					rwtest.Event(1, rwtest.DT(base+1), "a", int32(1)), rwtest.Event(2, nil, "a", int32(100)), rwtest.Event(3, rwtest.DT(base+3), "a", int32(10)), rwtest.Event(4, rwtest.DT(base+4), "a", "x"), rwtest.Event(5, rwtest.DT(base+5), "a", int32(1000)),
				}, bson.E{Key: "ordered", Value: false})
			},
			reply:  okReply(2, 1, 3, 4),
			events: 2,
			want: []bson.D{rollupUpdate("1h", []bson.D{
				rollupUpsert("1h", "a", base, 2, int32(11), base+1, base+3, int32(1), int32(10)),
			})},
		},
		{
			name: "ordered: nothing after the first invalid event counts",
			rule: rollupRule(time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base+1), "a", int32(1)), rwtest.Event(2, "notadate", "a", int32(1)), rwtest.Event(3, rwtest.DT(base+3), "a", int32(1))})
			},
			reply:  okReply(1, 1),
			events: 1,
			want: []bson.D{rollupUpdate("1h", []bson.D{
				rollupUpsert("1h", "a", base, 1, int32(1), base+1, base+1, int32(1), int32(1)),
			})},
		},
		{
			name: "no meta, no aggregate value: null series, count only; UTC days",
			rule: rollupRule(24 * time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				day := base / (24 * rwtest.Hour) * (24 * rwtest.Hour)
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(day), nil, nil), rwtest.Event(2, rwtest.DT(day-1), nil, nil), rwtest.Event(3, rwtest.DT(day+5), nil, nil)})
			},
			reply:  okReply(3),
			events: 3,
			want: func() []bson.D {
				day := base / (24 * rwtest.Hour) * (24 * rwtest.Hour)
				return []bson.D{rollupUpdate("1d", []bson.D{
					rollupUpsert("1d", nil, day, 2, nil, day, day+5, nil, nil),
					rollupUpsert("1d", nil, day-24*rwtest.Hour, 1, nil, day-1, day-1, nil, nil),
				})}
			}(),
		},
		{
			name: "statements split by MaxStatements; writeConcern carried, lsid not",
			rule: rollupRule(time.Minute),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base), "a", int32(1)), rwtest.Event(2, rwtest.DT(base+minute), "a", int32(1)), rwtest.Event(3, rwtest.DT(base+2*minute), "a", int32(1))},
					bson.E{Key: "writeConcern", Value: bson.D{{Key: "w", Value: "majority"}}},
					bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(4)})
			},
			reply:  okReply(3),
			opts:   Options{MaxStatements: 2},
			events: 3,
			want: []bson.D{
				rollupUpdate("1m", []bson.D{
					rollupUpsert("1m", "a", base, 1, int32(1), base, base, int32(1), int32(1)),
					rollupUpsert("1m", "a", base+minute, 1, int32(1), base+minute, base+minute, int32(1), int32(1)),
				}, bson.E{Key: "writeConcern", Value: bson.D{{Key: "w", Value: "majority"}}}),
				rollupUpdate("1m", []bson.D{
					rollupUpsert("1m", "a", base+2*minute, 1, int32(1), base+2*minute, base+2*minute, int32(1), int32(1)),
				}, bson.E{Key: "writeConcern", Value: bson.D{{Key: "w", Value: "majority"}}}),
			},
		},
		{
			name: "retryable write on an upstream with stmtIds: lsid, txnNumber and stable stmtIds",
			rule: rollupRule(time.Minute, time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base), "a", int32(1)), rwtest.Event(2, rwtest.DT(base+minute), "a", int32(1)), rwtest.Event(3, rwtest.DT(base+5), "b", int32(1))},
					bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(4)})
			},
			reply:  okReply(3),
			opts:   Options{StmtIDs: true},
			events: 3,
			want: []bson.D{
				rollupUpdate("1m", []bson.D{
					rollupUpsert("1m", "a", base, 1, int32(1), base, base, int32(1), int32(1)),
					rollupUpsert("1m", "a", base+minute, 1, int32(1), base+minute, base+minute, int32(1), int32(1)),
					rollupUpsert("1m", "b", base, 1, int32(1), base+5, base+5, int32(1), int32(1)),
				}, bson.E{Key: "stmtIds", Value: bson.A{int32(1 << 24), int32(1<<24 + 1), int32(1<<24 + 2)}},
					bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(4)}),
				rollupUpdate("1h", []bson.D{
					rollupUpsert("1h", "a", base, 2, int32(2), base, base+minute, int32(1), int32(1)),
					rollupUpsert("1h", "b", base, 1, int32(1), base+5, base+5, int32(1), int32(1)),
				}, bson.E{Key: "stmtIds", Value: bson.A{int32(1<<24 + 1<<17), int32(1<<24 + 1<<17 + 2)}},
					bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(4)}),
			},
		},
		{
			name: "inside a transaction the session fields are carried",
			rule: rollupRule(time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base), "a", int32(1))},
					bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(4)}, bson.E{Key: "autocommit", Value: false})
			},
			reply:  okReply(1),
			events: 1,
			want: []bson.D{rollupUpdate("1h", []bson.D{
				rollupUpsert("1h", "a", base, 1, int32(1), base, base, int32(1), int32(1)),
			}, bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: int32(1)}}}, bson.E{Key: "txnNumber", Value: int64(4)}, bson.E{Key: "autocommit", Value: false})},
		},
		{
			name: "command error reply: nothing counted",
			rule: rollupRule(time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base), "a", int32(1))})
			},
			reply: bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "down"}, {Key: "code", Value: int32(6)}},
		},
		{
			name: "every event failed: nothing counted",
			rule: rollupRule(time.Hour),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base), "a", int32(1))})
			},
			reply: okReply(0, 0),
		},
		{
			name: "rule without rollups",
			rule: rollupRule(),
			cmd: func(t *testing.T) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(1, rwtest.DT(base), "a", int32(1))})
			},
			reply: okReply(1),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Of(tc.cmd(t), tc.rule, rwtest.Doc(t, tc.reply), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if p != nil {
					t.Fatalf("got a plan of %d commands, want none", len(p.Commands))
				}
				return
			}
			if p.Events != tc.events {
				t.Errorf("Events = %d, want %d", p.Events, tc.events)
			}
			if len(p.Commands) != len(tc.want) {
				for i, c := range p.Commands {
					t.Logf("command %d: %s", i, bson.Raw(c).String())
				}
				t.Fatalf("got %d commands, want %d", len(p.Commands), len(tc.want))
			}
			for i := range tc.want {
				rwtest.AssertDoc(t, "command", p.Commands[i], tc.want[i])
			}
		})
	}
}

func TestRollupsBadCommand(t *testing.T) {
	cmd := rewrite.Command{Body: rwtest.Doc(t, bson.D{{Key: "insert", Value: "other"}, {Key: "documents", Value: bson.A{}}, {Key: "$db", Value: "iot"}})}
	_, err := Of(cmd, rollupRule(time.Hour), rwtest.Doc(t, okReply(0)), Options{})
	if err == nil || !strings.Contains(err.Error(), "rollups iot.readings") {
		t.Fatalf("err = %v", err)
	}
}

func TestRollupReplyError(t *testing.T) {
	cmd := rwtest.Doc(t, rollupUpdate("1h", nil))
	cases := []struct {
		reply bson.D
		want  string
	}{
		{okReply(2), ""},
		{okReply(1, 1), "rollup update of readings.rollup_1h: 1 of its statements failed; statement 1: x (code 11000)"},
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: int32(13)}}, "rollup update of readings.rollup_1h: no (code 13)"},
	}
	for _, tc := range cases {
		err := ReplyError(cmd, rwtest.Doc(t, tc.reply))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

// TestRollupsOfEvents: a rebuild from stored events plans the same
// statements as the live path, without the client's fields, and skips
// events the rule refuses.
func TestRollupsOfEvents(t *testing.T) {
	base := int64(1_700_000_000_000) / rwtest.Hour * rwtest.Hour
	events := []bson.D{rwtest.Event(1, rwtest.DT(base+5), "a", int32(2)), rwtest.Event(2, nil, "a", int32(9)), rwtest.Event(3, rwtest.DT(base+10), "a", int32(3))}
	var docs [][]byte
	for _, e := range events {
		docs = append(docs, rwtest.Doc(t, e))
	}
	docs = append(docs, []byte{1, 2, 3}) // not BSON
	p, skipped, err := OfEvents(rollupRule(time.Hour), docs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if skipped != 2 || p.Events != 2 || len(p.Commands) != 1 {
		t.Fatalf("skipped %d, events %d, %d commands", skipped, p.Events, len(p.Commands))
	}
	rwtest.AssertDoc(t, "rebuild", p.Commands[0], rollupUpdate("1h", []bson.D{
		rollupUpsert("1h", "a", base, 2, int32(5), base+5, base+10, int32(2), int32(3)),
	}))
	if p, _, _ := OfEvents(rollupRule(), docs, Options{}); p != nil {
		t.Fatal("a rule without rollups planned commands")
	}
}
