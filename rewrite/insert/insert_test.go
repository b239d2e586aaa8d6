package insert

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/wire"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// upsertL is an expected upsert statement for a rule with the given limits.
func upsertL(maxEvents, maxBytes int32, meta any, start int64, count, nbytes int32, events bson.A, inc, minD, maxD bson.D) bson.D {
	return upsertAt(0, false, maxEvents, maxBytes, meta, start, count, nbytes, events, inc, minD, maxD)
}

// oneUpsert is the upsert of a single stored event with value v (int32).
func oneUpsert(t testing.TB, meta any, start int64, s bson.D, ts int64, v any) bson.D {
	var inc, mn, mx bson.D
	mn = bson.D{{Key: "min.ts", Value: rwtest.DT(ts)}}
	mx = bson.D{{Key: "max.ts", Value: rwtest.DT(ts)}}
	if v != nil {
		inc = bson.D{{Key: "sum.value", Value: v}}
		mn = append(mn, bson.E{Key: "min.value", Value: v})
		mx = append(mx, bson.E{Key: "max.value", Value: v})
	}
	return upsert(meta, start, 1, size(t, s), bson.A{s}, inc, mn, mx)
}

func TestInsertCommands(t *testing.T) {
	uuid := bson.Binary{Subtype: 4, Data: bytes.Repeat([]byte{0xAB}, 16)}
	lsid := bson.D{{Key: "id", Value: uuid}}

	// Three events of series s1 in window 0 (a complete bucket) and a
	// fourth for the next, upserted.
	four := []bson.D{
		rwtest.Event(rwtest.OID(101), rwtest.DT(1000), "s1", int32(1)),
		rwtest.Event(rwtest.OID(102), rwtest.DT(3000), "s1", int32(3)),
		rwtest.Event(rwtest.OID(103), rwtest.DT(2000), "s1", int32(2)),
		rwtest.Event(rwtest.OID(104), rwtest.DT(4000), "s1", int32(4)),
	}
	st := func(i int) bson.D { // stored form of four[i]
		return rwtest.Stored(four[i][0].Value, four[i][1].Value, true, four[i][3].Value)
	}
	bucketOf3 := func(id bson.ObjectID) bson.D {
		return bson.D{
			{Key: "_id", Value: id},
			{Key: "meta", Value: "s1"},
			{Key: "start", Value: rwtest.DT(0)},
			{Key: "count", Value: int32(3)},
			{Key: "bytes", Value: size(t, st(0), st(1), st(2))},
			{Key: "min", Value: bson.D{{Key: "ts", Value: rwtest.DT(1000)}, {Key: "value", Value: int32(1)}}},
			{Key: "max", Value: bson.D{{Key: "ts", Value: rwtest.DT(3000)}, {Key: "value", Value: int32(3)}}},
			{Key: "counted", Value: int32(3)},
			{Key: "summed", Value: bson.D{{Key: "value", Value: true}}},
			{Key: "sum", Value: bson.D{{Key: "value", Value: int32(6)}}},
			{Key: "counts", Value: bson.D{{Key: "value", Value: int32(3)}}},
			{Key: "lowBit", Value: bson.D{{Key: "value", Value: int32(0)}}},
			{Key: "events", Value: bson.A{st(0), st(1), st(2)}},
		}
	}
	fourth := oneUpsert(t, "s1", 0, st(3), 4000, int32(4))
	fourth[0].Value = bson.D{fourth[0].Value.(bson.D)[0], fourth[0].Value.(bson.D)[1], fourth[0].Value.(bson.D)[2]}
	fourth[0].Value.(bson.D)[0].Value = bid("s1", 0, 1) // the fourth event opens bucket seq 1

	// Events at window boundaries, before 1970 included.
	bounds := []bson.D{
		rwtest.Event(rwtest.OID(1), rwtest.DT(-1), "s", nil),
		rwtest.Event(rwtest.OID(2), rwtest.DT(0), "s", nil),
		rwtest.Event(rwtest.OID(3), rwtest.DT(rwtest.Hour-1), "s", nil),
		rwtest.Event(rwtest.OID(4), rwtest.DT(rwtest.Hour), "s", nil),
		rwtest.Event(rwtest.OID(5), rwtest.DT(-rwtest.Hour), "s", nil),
	}
	bst := func(i int) bson.D { return rwtest.Stored(bounds[i][0].Value, bounds[i][1].Value, true, nil) }
	tsRange := func(lo, hi int64) (bson.D, bson.D) {
		return bson.D{{Key: "min.ts", Value: rwtest.DT(lo)}}, bson.D{{Key: "max.ts", Value: rwtest.DT(hi)}}
	}
	mnA, mxA := tsRange(-rwtest.Hour, -1)
	mnB, mxB := tsRange(0, rwtest.Hour-1)

	// Meta of every kind; missing and null are the same (null) series;
	// documents with the same fields in another order are another series.
	metas := []bson.D{
		rwtest.Event(rwtest.OID(1), rwtest.DT(10), "a", nil),
		rwtest.Event(rwtest.OID(2), rwtest.DT(10), int32(7), nil),
		rwtest.Event(rwtest.OID(3), rwtest.DT(10), bson.D{{Key: "x", Value: int32(1)}, {Key: "y", Value: int32(2)}}, nil),
		rwtest.Event(rwtest.OID(4), rwtest.DT(10), bson.D{{Key: "y", Value: int32(2)}, {Key: "x", Value: int32(1)}}, nil),
		rwtest.Event(rwtest.OID(5), rwtest.DT(10), nil, nil),
		{{Key: "_id", Value: rwtest.OID(6)}, {Key: "ts", Value: rwtest.DT(20)}, {Key: "sensorId", Value: nil}},
		rwtest.Event(rwtest.OID(7), rwtest.DT(10), int64(7), nil),
	}
	mst := func(i int) bson.D { return rwtest.Stored(rwtest.OID(byte(i+1)), metas[i][1].Value, i != 4, nil) }
	one := func(meta any, i int) bson.D { return oneUpsert(t, meta, 0, mst(i), 10, nil) }
	xyGroup := upsert(metas[2][2].Value, 0, 2, size(t, mst(2), mst(3)), bson.A{mst(2), mst(3)}, nil,
		bson.D{{Key: "min.ts", Value: rwtest.DT(10)}}, bson.D{{Key: "max.ts", Value: rwtest.DT(10)}})
	nullGroup := upsert(nil, 0, 2, size(t, mst(4), mst(5)), bson.A{mst(4), mst(5)}, nil,
		bson.D{{Key: "min.ts", Value: rwtest.DT(10)}}, bson.D{{Key: "max.ts", Value: rwtest.DT(20)}})

	// Mixed numeric types: sums follow $inc, min/max compare numerically.
	mixed := []bson.D{
		rwtest.Event(rwtest.OID(1), rwtest.DT(1), "m", int64(2)),
		rwtest.Event(rwtest.OID(2), rwtest.DT(2), "m", int32(3)),
		rwtest.Event(rwtest.OID(3), rwtest.DT(3), "m", 1.5),
		rwtest.Event(rwtest.OID(4), rwtest.DT(4), "m", nil),
	}
	mxst := func(i int) bson.D {
		return rwtest.Stored(rwtest.OID(byte(i+1)), mixed[i][1].Value, true, mixed[i][len(mixed[i])-1].Value)
	}
	mxst3 := rwtest.Stored(rwtest.OID(4), rwtest.DT(4), true, nil)

	// Size-bounded chunks: 2 stored events fit in 120 bytes, 3 do not.
	small := []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "b", int32(1)), rwtest.Event(rwtest.OID(2), rwtest.DT(2), "b", int32(2)), rwtest.Event(rwtest.OID(3), rwtest.DT(3), "b", int32(3))}
	sst := func(i int) bson.D {
		return rwtest.Stored(rwtest.OID(byte(i+1)), small[i][1].Value, true, small[i][3].Value)
	}

	tests := []struct {
		name   string
		rule   func(*rules.Rule)
		cmd    func(t testing.TB) rewrite.Command
		caps   caps.Upstream
		want   []bson.D
		events [][]int // event indexes of each command's statements
	}{
		{
			name: "single event in body without _id gets one and is upserted",
			cmd: func(t testing.TB) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(nil, rwtest.DT(1000), "s1", int32(5))})
			},
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{
				oneUpsert(t, "s1", 0, rwtest.Stored(rwtest.OID(1), rwtest.DT(1000), true, int32(5)), 1000, int32(5)),
			})},
		},
		{
			name: "single event in a document sequence",
			cmd: func(t testing.TB) rewrite.Command {
				return rwtest.SeqCmd(t, []bson.D{rwtest.Event(nil, rwtest.DT(1000), "s1", int32(5))})
			},
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{
				oneUpsert(t, "s1", 0, rwtest.Stored(rwtest.OID(1), rwtest.DT(1000), true, int32(5)), 1000, int32(5)),
			})},
		},
		{
			name:   "group past maxEvents: complete bucket insert plus upsert of the rest",
			cmd:    func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, four) },
			want:   []bson.D{insertCmd(true, []bson.D{bucketOf3(bid("s1", 0, 0))}), rwtest.UpdateCmd(true, []bson.D{fourth})},
			events: [][]int{{0, 1, 2}, {3}},
		},
		{
			name:   "same group from a document sequence",
			cmd:    func(t testing.TB) rewrite.Command { return rwtest.SeqCmd(t, four) },
			want:   []bson.D{insertCmd(true, []bson.D{bucketOf3(bid("s1", 0, 0))}), rwtest.UpdateCmd(true, []bson.D{fourth})},
			events: [][]int{{0, 1, 2}, {3}},
		},
		{
			name: "below InsertThreshold everything is upserted",
			rule: func(r *rules.Rule) { r.MaxEvents = 10; r.InsertThreshold = 5 },
			cmd:  func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, four[:3]) },
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{upsertL(10, 1<<20, "s1", 0, 3, size(t, st(0), st(1), st(2)),
				bson.A{st(0), st(1), st(2)},
				bson.D{{Key: "sum.value", Value: int32(6)}},
				bson.D{{Key: "min.ts", Value: rwtest.DT(1000)}, {Key: "min.value", Value: int32(1)}},
				bson.D{{Key: "max.ts", Value: rwtest.DT(3000)}, {Key: "max.value", Value: int32(3)}})})},
		},
		{
			name: "windows: negative times and exact boundaries, in order of first appearance",
			rule: func(r *rules.Rule) { r.InsertThreshold = 100 },
			cmd:  func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, bounds) },
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{
				upsert("s", -rwtest.Hour, 2, size(t, bst(0), bst(4)), bson.A{bst(0), bst(4)}, nil, mnA, mxA),
				upsert("s", 0, 2, size(t, bst(1), bst(2)), bson.A{bst(1), bst(2)}, nil, mnB, mxB),
				oneUpsert(t, "s", rwtest.Hour, bst(3), rwtest.Hour, nil),
			})},
			events: [][]int{{0, 4}, {1, 2}, {3}},
		},
		{
			// {x, y} and {y, x} are one series, kept as {x, y}: MongoDB
			// sorts the fields of a meta object at insert.
			name: "meta as string, number, documents (fields sorted), missing, null; int32 7 and int64 7 differ",
			rule: func(r *rules.Rule) { r.InsertThreshold = 100 },
			cmd:  func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, metas) },
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{
				one("a", 0), one(int32(7), 1), xyGroup, nullGroup, one(int64(7), 6),
			})},
			events: [][]int{{0}, {1}, {2, 3}, {4, 5}, {6}},
		},
		{
			name: "rule without metaField: every event in the null series, fields kept",
			rule: func(r *rules.Rule) { r.MetaField = "" },
			cmd: func(t testing.TB) rewrite.Command {
				return rwtest.BodyCmd(t, []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(5), "kept", nil)})
			},
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{oneUpsert(t, nil, 0, rwtest.Event(rwtest.OID(1), rwtest.DT(5), "kept", nil), 5, nil)})},
		},
		{
			name: "aggregates of mixed numeric types in a complete bucket",
			rule: func(r *rules.Rule) { r.MaxEvents = 4; r.InsertThreshold = 4 },
			cmd:  func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, mixed) },
			want: []bson.D{insertCmd(true, []bson.D{{
				{Key: "_id", Value: bid("m", 0, 0)},
				{Key: "meta", Value: "m"},
				{Key: "start", Value: rwtest.DT(0)},
				{Key: "count", Value: int32(4)},
				{Key: "bytes", Value: size(t, mxst(0), mxst(1), mxst(2), mxst3)},
				{Key: "min", Value: bson.D{{Key: "ts", Value: rwtest.DT(1)}, {Key: "value", Value: 1.5}}},
				{Key: "max", Value: bson.D{{Key: "ts", Value: rwtest.DT(4)}, {Key: "value", Value: int32(3)}}},
				{Key: "counted", Value: int32(4)},
				{Key: "summed", Value: bson.D{{Key: "value", Value: true}}},
				{Key: "sum", Value: bson.D{{Key: "value", Value: 6.5}}},
				{Key: "counts", Value: bson.D{{Key: "value", Value: int32(3)}}},
				{Key: "lowBit", Value: bson.D{{Key: "value", Value: int32(-1)}}},
				{Key: "events", Value: bson.A{mxst(0), mxst(1), mxst(2), mxst3}},
			}})},
		},
		{
			name: "chunks bounded by maxBytes",
			rule: func(r *rules.Rule) { r.MaxBytes = 120 },
			cmd:  func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, small) },
			want: []bson.D{rwtest.UpdateCmd(true, []bson.D{
				upsertL(3, 120, "b", 0, 2, size(t, sst(0), sst(1)), bson.A{sst(0), sst(1)},
					bson.D{{Key: "sum.value", Value: int32(3)}},
					bson.D{{Key: "min.ts", Value: rwtest.DT(1)}, {Key: "min.value", Value: int32(1)}},
					bson.D{{Key: "max.ts", Value: rwtest.DT(2)}, {Key: "max.value", Value: int32(2)}}),
				upsertAt(1, false, 3, 120, "b", 0, 1, size(t, sst(2)), bson.A{sst(2)},
					bson.D{{Key: "sum.value", Value: int32(3)}},
					bson.D{{Key: "min.ts", Value: rwtest.DT(3)}, {Key: "min.value", Value: int32(3)}},
					bson.D{{Key: "max.ts", Value: rwtest.DT(3)}, {Key: "max.value", Value: int32(3)}}),
			})},
			events: [][]int{{0, 1}, {2}},
		},
		{
			name: "retryable write: carried fields, stmtIds, unknown fields dropped",
			caps: caps.Upstream{StmtIDs: true},
			cmd: func(t testing.TB) rewrite.Command {
				return rwtest.BodyCmd(t, four,
					bson.E{Key: "ordered", Value: false},
					bson.E{Key: "foo", Value: "not carried"},
					bson.E{Key: "comment", Value: "c"},
					bson.E{Key: "writeConcern", Value: bson.D{{Key: "w", Value: "majority"}}},
					bson.E{Key: "txnNumber", Value: int64(7)},
					bson.E{Key: "lsid", Value: lsid},
					bson.E{Key: "bypassDocumentValidation", Value: true},
					bson.E{Key: "$clusterTime", Value: bson.D{{Key: "clusterTime", Value: bson.Timestamp{T: 1, I: 2}}}},
					bson.E{Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primary"}}},
				)
			},
			want: []bson.D{
				insertCmd(false, []bson.D{bucketOf3(bid("s1", 0, 0))},
					bson.E{Key: "stmtIds", Value: bson.A{int32(0)}},
					bson.E{Key: "lsid", Value: lsid},
					bson.E{Key: "txnNumber", Value: int64(7)},
					bson.E{Key: "writeConcern", Value: bson.D{{Key: "w", Value: "majority"}}},
					bson.E{Key: "bypassDocumentValidation", Value: true},
					bson.E{Key: "comment", Value: "c"},
					bson.E{Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primary"}}},
					bson.E{Key: "$clusterTime", Value: bson.D{{Key: "clusterTime", Value: bson.Timestamp{T: 1, I: 2}}}},
				),
				rwtest.UpdateCmd(false, []bson.D{fourth},
					bson.E{Key: "stmtIds", Value: bson.A{int32(3)}},
					bson.E{Key: "lsid", Value: lsid},
					bson.E{Key: "txnNumber", Value: int64(7)},
					bson.E{Key: "writeConcern", Value: bson.D{{Key: "w", Value: "majority"}}},
					bson.E{Key: "bypassDocumentValidation", Value: true},
					bson.E{Key: "comment", Value: "c"},
					bson.E{Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primary"}}},
					bson.E{Key: "$clusterTime", Value: bson.D{{Key: "clusterTime", Value: bson.Timestamp{T: 1, I: 2}}}},
				),
			},
		},
		{
			name: "retryable write on an upstream without stmtIds: no stmtIds",
			cmd: func(t testing.TB) rewrite.Command {
				return rwtest.BodyCmd(t, four, bson.E{Key: "lsid", Value: lsid}, bson.E{Key: "txnNumber", Value: int64(7)})
			},
			want: []bson.D{
				insertCmd(true, []bson.D{bucketOf3(bid("s1", 0, 0))},
					bson.E{Key: "lsid", Value: lsid}, bson.E{Key: "txnNumber", Value: int64(7)}),
				rwtest.UpdateCmd(true, []bson.D{fourth},
					bson.E{Key: "lsid", Value: lsid}, bson.E{Key: "txnNumber", Value: int64(7)}),
			},
		},
		{
			name: "transaction: no stmtIds; startTransaction and readConcern only on the first command",
			caps: caps.Upstream{StmtIDs: true},
			cmd: func(t testing.TB) rewrite.Command {
				return rwtest.BodyCmd(t, four,
					bson.E{Key: "lsid", Value: lsid},
					bson.E{Key: "txnNumber", Value: int64(7)},
					bson.E{Key: "startTransaction", Value: true},
					bson.E{Key: "autocommit", Value: false},
					bson.E{Key: "readConcern", Value: bson.D{{Key: "level", Value: "snapshot"}}},
				)
			},
			want: []bson.D{
				insertCmd(true, []bson.D{bucketOf3(bid("s1", 0, 0))},
					bson.E{Key: "lsid", Value: lsid},
					bson.E{Key: "txnNumber", Value: int64(7)},
					bson.E{Key: "autocommit", Value: false},
					bson.E{Key: "startTransaction", Value: true},
					bson.E{Key: "readConcern", Value: bson.D{{Key: "level", Value: "snapshot"}}}),
				rwtest.UpdateCmd(true, []bson.D{fourth},
					bson.E{Key: "lsid", Value: lsid},
					bson.E{Key: "txnNumber", Value: int64(7)},
					bson.E{Key: "autocommit", Value: false}),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := rwtest.InsertRule()
			if tc.rule != nil {
				tc.rule(rule)
			}
			o := opts()
			o.Caps = tc.caps
			p := mustInsert(t, tc.cmd(t), rule, o)
			assertCommands(t, p, tc.want...)
			for _, c := range p.Commands {
				if err := wire.ValidateDocument(c); err != nil {
					t.Errorf("command is not valid BSON: %v", err)
				}
			}
			if tc.events != nil {
				var got [][]int
				for _, pc := range p.upstream {
					for _, st := range pc.statements {
						got = append(got, st.events)
					}
				}
				if !equalIndexes(got, tc.events) {
					t.Errorf("statement events = %v, want %v", got, tc.events)
				}
			}
		})
	}
}

func equalIndexes(a, b [][]int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

// okReplies answers every command of p with success.
func okReplies(t testing.TB, p *Commands) []bsoncore.Document {
	var out []bsoncore.Document
	for _, pc := range p.upstream {
		out = append(out, rwtest.Doc(t, bson.D{{Key: "n", Value: int32(len(pc.statements))}, {Key: "ok", Value: 1.0}}))
	}
	return out
}

type we struct {
	index int32
	code  mongoerr.Code
	msg   string
}

func reply(n int32, errs ...we) bson.D {
	d := bson.D{{Key: "n", Value: n}}
	if len(errs) > 0 {
		arr := bson.A{}
		for _, e := range errs {
			arr = append(arr, bson.D{{Key: "index", Value: e.index}, {Key: "code", Value: e.code}, {Key: "errmsg", Value: e.msg}})
		}
		d = append(d, bson.E{Key: "writeErrors", Value: arr})
	}
	return append(d, bson.E{Key: "ok", Value: 1.0})
}

func TestInsertValidation(t *testing.T) {
	const (
		noTS     = `tsproxy rule iot.readings: 'ts' must be present and contain a valid BSON UTC datetime value (got none)`
		tsString = `tsproxy rule iot.readings: 'ts' must be present and contain a valid BSON UTC datetime value (got string)`
		metaArr  = `tsproxy rule iot.readings: metaField "sensorId": values of type array are not supported`
		tooBig   = `tsproxy rule iot.readings: event is 124 bytes as stored, more than the bucket limit maxBytes 120`
		outRange = `tsproxy rule iot.readings: timeField "ts" date -9223372036854775808 is out of the supported range`
		dupMeta  = `tsproxy rule iot.readings: event has field "sensorId" more than once`
		dupTime  = `tsproxy rule iot.readings: event has field "ts" more than once`
	)
	good := func(i byte) bson.D { return rwtest.Event(rwtest.OID(i), rwtest.DT(int64(i)), "s", int32(i)) }
	noTime := bson.D{{Key: "_id", Value: rwtest.OID(50)}, {Key: "sensorId", Value: "s"}}
	strTime := rwtest.Event(rwtest.OID(51), "2024-01-01", "s", nil)
	dec, _ := bson.ParseDecimal128("1.5")

	tests := []struct {
		name      string
		ordered   *bool
		events    []bson.D
		statement [][]int
		want      bson.D
	}{
		{"ordered, bad first", nil, []bson.D{noTime, good(1), good(2)}, nil, reply(0, we{0, 2, noTS})},
		{"ordered, bad middle", nil, []bson.D{good(0), strTime, good(2)}, [][]int{{0}}, reply(1, we{1, 2, tsString})},
		{"ordered, bad last", nil, []bson.D{good(0), good(1), noTime}, [][]int{{0, 1}}, reply(2, we{2, 2, noTS})},
		{"unordered, bad first", ptr(false), []bson.D{noTime, good(1), good(2)}, [][]int{{1, 2}}, reply(2, we{0, 2, noTS})},
		{"unordered, bad middle and last", ptr(false), []bson.D{good(0), strTime, good(2), noTime},
			[][]int{{0, 2}}, reply(2, we{1, 2, tsString}, we{3, 2, noTS})},
		{"unordered, every event bad", ptr(false), []bson.D{noTime, strTime}, nil, reply(0, we{0, 2, noTS}, we{1, 2, tsString})},
		// Stored, as a plain or native time-series collection stores them;
		// the bucket is marked mixed (rewrite/bucket).
		{"aggregate of a string", ptr(false), []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "s", "high"), good(2)}, [][]int{{0, 1}}, reply(2)},
		{"aggregate of a decimal", nil, []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "s", dec)}, [][]int{{0}}, reply(1)},
		{"missing aggregate is fine", nil, []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "s", nil)}, [][]int{{0}}, reply(1)},
		{"array meta", ptr(false), []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), bson.A{int32(1)}, nil), good(2)}, [][]int{{1}}, reply(1, we{0, 2, metaArr})},
		// Stored with the name escaped (bucket.StoredMeta), as MongoDB
		// stores it; the upsert's filter is on _id, never on the meta.
		{"operator-like meta", nil, []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), bson.D{{Key: "$gt", Value: int32(1)}}, nil)}, [][]int{{0}}, reply(1)},
		{"event larger than maxBytes", ptr(false), []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "s", nil), {{Key: "ts", Value: rwtest.DT(2)}, {Key: "pad", Value: strings.Repeat("x", 80)}}},
			[][]int{{0}}, reply(1, we{1, 10334, tooBig})},
		{"meta field twice", ptr(false), []bson.D{append(rwtest.Event(rwtest.OID(1), rwtest.DT(1), "a", nil), bson.E{Key: "sensorId", Value: "b"}), good(2)},
			[][]int{{1}}, reply(1, we{0, 2, dupMeta})},
		{"time field twice", nil, []bson.D{append(rwtest.Event(rwtest.OID(1), rwtest.DT(1), "a", nil), bson.E{Key: "ts", Value: rwtest.DT(2)})}, nil, reply(0, we{0, 2, dupTime})},
		{"time out of range", nil, []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(math.MinInt64), "s", nil)}, nil, reply(0, we{0, 2, outRange})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := rwtest.InsertRule()
			rule.InsertThreshold = 100
			rule.MaxBytes = 120
			var extra []bson.E
			if tc.ordered != nil {
				extra = append(extra, bson.E{Key: "ordered", Value: *tc.ordered})
			}
			p := mustInsert(t, rwtest.BodyCmd(t, tc.events, extra...), rule, opts())
			var got [][]int
			for _, pc := range p.upstream {
				for _, st := range pc.statements {
					got = append(got, st.events)
				}
			}
			if !equalIndexes(got, tc.statement) {
				t.Errorf("statement events = %v, want %v", got, tc.statement)
			}
			rwtest.AssertDoc(t, "reply", p.Reply(okReplies(t, p)), tc.want)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestInsertCommandErrors(t *testing.T) {
	docs := []bson.D{rwtest.Event(rwtest.OID(1), rwtest.DT(1), "s", nil)}
	withBody := func(d bson.D) func(testing.TB) rewrite.Command {
		return func(t testing.TB) rewrite.Command { return rewrite.Command{Body: rwtest.Doc(t, d)} }
	}
	tests := []struct {
		name string
		cmd  func(testing.TB) rewrite.Command
		rule func(*rules.Rule)
		opts func(*Options)
		code mongoerr.Code
		msg  string
	}{
		{name: "documents not an array", cmd: withBody(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: "x"}, {Key: "$db", Value: "iot"}}),
			code: mongoerr.TypeMismatch, msg: `field "documents" must be an array, got string`},
		{name: "no documents", cmd: withBody(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{}}, {Key: "$db", Value: "iot"}}),
			code: mongoerr.InvalidLength, msg: "insert has no documents"},
		{name: "documents missing", cmd: withBody(bson.D{{Key: "insert", Value: "readings"}, {Key: "$db", Value: "iot"}}),
			code: mongoerr.BadValue, msg: `missing field "documents"`},
		{name: "document not an object", cmd: withBody(bson.D{{Key: "insert", Value: "readings"}, {Key: "documents", Value: bson.A{int32(1)}}, {Key: "$db", Value: "iot"}}),
			code: mongoerr.TypeMismatch, msg: "documents.0 must be a document, got int"},
		{name: "documents in body and sequence", cmd: func(t testing.TB) rewrite.Command {
			c := rwtest.BodyCmd(t, docs)
			c.Sequences = rwtest.SeqCmd(t, docs).Sequences
			return c
		}, code: mongoerr.BadValue, msg: `field "documents" is both in the body and in a document sequence`},
		{name: "unknown sequence", cmd: func(t testing.TB) rewrite.Command {
			c := rwtest.SeqCmd(t, docs)
			c.Sequences[0].Identifier = "updates"
			return c
		}, code: mongoerr.BadValue, msg: `unexpected document sequence "updates"`},
		{name: "other collection", cmd: withBody(bson.D{{Key: "insert", Value: "other"}, {Key: "documents", Value: bson.A{docs[0]}}}),
			code: mongoerr.BadValue, msg: `insert on collection "other" does not match the rule's collection "readings"`},
		{name: "not an insert", cmd: withBody(bson.D{{Key: "find", Value: "readings"}}),
			code: mongoerr.BadValue, msg: `the command is "find", not insert`},
		{name: "empty command", cmd: withBody(bson.D{}),
			code: mongoerr.BadValue, msg: "empty command"},
		{name: "collection name not a string", cmd: withBody(bson.D{{Key: "insert", Value: int32(1)}, {Key: "documents", Value: bson.A{docs[0]}}}),
			code: mongoerr.TypeMismatch, msg: "collection name must be a string, got int"},
		{name: "ordered not a bool", cmd: func(t testing.TB) rewrite.Command {
			return rwtest.BodyCmd(t, docs, bson.E{Key: "ordered", Value: "yes"})
		},
			code: mongoerr.TypeMismatch, msg: `field "ordered" must be a boolean, got string`},
		{name: "no id generator", cmd: func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, docs) }, opts: func(o *Options) { o.NewObjectID = nil },
			code: mongoerr.InternalError, msg: "NewObjectID is nil"},
		{name: "dotted aggregate", cmd: func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, docs) }, rule: func(r *rules.Rule) { r.Aggregates = []string{"a.b"} },
			code: mongoerr.InternalError, msg: `field name "a.b"`},
		{name: "span below a millisecond", cmd: func(t testing.TB) rewrite.Command { return rwtest.BodyCmd(t, docs) }, rule: func(r *rules.Rule) { r.Span = 10 },
			code: mongoerr.InternalError, msg: "not a positive whole number of milliseconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := rwtest.InsertRule()
			if tc.rule != nil {
				tc.rule(rule)
			}
			o := opts()
			if tc.opts != nil {
				tc.opts(&o)
			}
			p, err := New(tc.cmd(t), rule, o)
			if err == nil {
				t.Fatalf("Insert succeeded with %d commands, want an error", len(p.Commands))
			}
			var ce *mongoerr.Error
			if !errors.As(err, &ce) || ce.Code != tc.code {
				t.Errorf("error %v: want a mongoerr.Error with code %d", err, tc.code)
			}
			if !strings.HasPrefix(err.Error(), "rewrite insert iot.readings: ") || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q: want prefix %q and %q", err, "rewrite insert iot.readings: ", tc.msg)
			}
			r := mongoerr.Reply(err)
			if ok, _ := bsoncore.Document(r).Lookup("ok").AsFloat64OK(); ok != 0 {
				t.Errorf("ErrorReply ok = %v", ok)
			}
			if c, _ := bsoncore.Document(r).Lookup("code").Int32OK(); mongoerr.Code(c) != tc.code {
				t.Errorf("ErrorReply code = %d, want %d", c, tc.code)
			}
		})
	}
	if _, err := New(rwtest.BodyCmd(t, docs), nil, opts()); err == nil {
		t.Errorf("Insert with a nil rule succeeded")
	}
}
