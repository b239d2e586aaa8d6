package deletes

import (
	"strings"
	"testing"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func delCmd(t *testing.T, stmts A, extra ...E) rewrite.Command {
	t.Helper()
	d := D{{Key: "delete", Value: "readings"}, {Key: "deletes", Value: stmts}}
	d = append(d, extra...)
	d = append(d, E{Key: "$db", Value: "iot"})
	return rewrite.Command{Body: rwtest.Doc(t, d)}
}

func stmt(q D, limit int) D { return D{{Key: "q", Value: q}, {Key: "limit", Value: limit}} }

func TestPlanDelete(t *testing.T) {
	rangeQ := D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(90 * 60_000)}, {Key: "$lt", Value: rwtest.DT(3 * rwtest.Hour)}}}}
	cases := []struct {
		name   string
		cmd    rewrite.Command
		ferret bool
		packed bool     // FerretDB with packed events: the proxy matches
		whole  []bool   // per statement
		one    []bool   // per statement
		match  []string // substrings of each statement's match command ("" none)
		serr   []string // substrings of each statement's error ("" none)
		err    string   // command error
	}{
		{name: "meta only: whole buckets", cmd: delCmd(t, A{stmt(D{{Key: "sensorId", Value: "s1"}}, 0)}),
			whole: []bool{true}, one: []bool{false},
			match: []string{`{"aggregate": "readings.buckets","pipeline": [{"$match": {"meta": "s1"}},{"$project": {"meta": {"$numberInt":"1"},"start": {"$numberInt":"1"}}}]`}},
		{name: "meta only, one event: the first bucket that holds one", cmd: delCmd(t, A{stmt(D{{Key: "sensorId", Value: "s1"}}, 1)}),
			whole: []bool{true}, one: []bool{true},
			match: []string{`"pipeline": [{"$match": {"$and": [{"meta": "s1"},{"count": {"$gt": {"$numberInt":"0"}}}]}},{"$project": {"meta": {"$numberInt":"1"},"start": {"$numberInt":"1"}}},{"$limit": {"$numberLong":"1"}}]`}},
		{name: "empty filter, one event: the first bucket that holds one", cmd: delCmd(t, A{stmt(D{}, 1)}),
			whole: []bool{true}, one: []bool{true},
			match: []string{`"pipeline": [{"$match": {"count": {"$gt": {"$numberInt":"0"}}}},{"$project"`}},
		{name: "empty filter: every bucket", cmd: delCmd(t, A{stmt(D{}, 0)}),
			whole: []bool{true}, one: []bool{false},
			match: []string{`"pipeline": [{"$project"`}},
		{name: "time range: buckets by start, events by ts", cmd: delCmd(t, A{stmt(rangeQ, 1)}),
			whole: []bool{false}, one: []bool{true},
			match: []string{`[{"$match": {"start": {"$gte": {"$date":{"$numberLong":"3600000"}},"$lt": {"$date":{"$numberLong":"10800000"}}}}},` + rwtest.Guard() + `{"$unwind": "$events"},{"$match": {"events.ts": {"$gte": {"$date":{"$numberLong":"5400000"}},"$lt": {"$date":{"$numberLong":"10800000"}}}}},{"$project": {"meta": {"$numberInt":"1"},"start": {"$numberInt":"1"},"events": {"$numberInt":"1"}}},{"$limit": {"$numberLong":"1"}}]`}},
		{name: "FerretDB: events only (its $unwind drops meta and start)", ferret: true, cmd: delCmd(t, A{stmt(D{{Key: "value", Value: 1}}, 0)}),
			whole: []bool{false}, one: []bool{false},
			match: []string{`[{"$unwind": "$events"},{"$match": {"events.value": {"$numberInt":"1"}}},{"$project": {"events": {"$numberInt":"1"}}}]`}},
		{name: "residual field", cmd: delCmd(t, A{stmt(D{{Key: "sensorId", Value: "s1"}, {Key: "value", Value: D{{Key: "$gt", Value: 5}}}}, 0)}),
			whole: []bool{false}, one: []bool{false},
			match: []string{`{"$match": {"meta": "s1"}},` + rwtest.Guard() + `{"$unwind": "$events"},{"$match": {"events.value": {"$gt": {"$numberInt":"5"}}}}`}},
		{name: "generic arguments carried, txnNumber not", cmd: delCmd(t, A{stmt(D{}, 1)},
			E{Key: "lsid", Value: D{{Key: "id", Value: "x"}}}, E{Key: "txnNumber", Value: int64(3)}, E{Key: "writeConcern", Value: D{{Key: "w", Value: 1}}}, E{Key: "comment", Value: "c"}),
			whole: []bool{true}, one: []bool{true},
			match: []string{`"lsid": {"id": "x"},"comment": "c","$db": "iot"}`}},
		{name: "statement errors: unsupported operator, a hint not a name or a key", cmd: delCmd(t, A{
			stmt(D{{Key: "$where", Value: "1"}}, 0),
			D{{Key: "q", Value: D{}}, {Key: "limit", Value: 0}, {Key: "hint", Value: 1}},
			stmt(D{{Key: "sensorId", Value: "s"}}, 0)}),
			whole: []bool{false, false, true}, one: []bool{false, false, false},
			serr: []string{`"$where" (JavaScript) is not supported`, `hint must be either a string or nested object`, ""}},
		{name: "a hint, accepted and ignored", cmd: delCmd(t, A{
			D{{Key: "q", Value: D{{Key: "sensorId", Value: "s"}}}, {Key: "limit", Value: 0}, {Key: "hint", Value: "sensorId_1_ts_1"}}}),
			whole: []bool{true}, one: []bool{false}, serr: []string{""}},
		{name: "metaField inside $or on FerretDB", ferret: true,
			cmd:   delCmd(t, A{stmt(D{{Key: "$or", Value: A{D{{Key: "sensorId", Value: "a"}}, D{{Key: "value", Value: 1}}}}}, 0)}),
			whole: []bool{false}, one: []bool{false}, serr: []string{"inside \"$or\""}},
		{name: "packed: time range lists whole buckets", packed: true, cmd: delCmd(t, A{stmt(rangeQ, 0)}),
			whole: []bool{false}, one: []bool{false},
			match: []string{`"pipeline": [{"$match": {"start": {"$gte": {"$date":{"$numberLong":"3600000"}},"$lt": {"$date":{"$numberLong":"10800000"}}}}}],"cursor": {"batchSize": {"$numberInt":"16"}}`}},
		{name: "packed: metaField inside $or scans every bucket", packed: true,
			cmd:   delCmd(t, A{stmt(D{{Key: "$or", Value: A{D{{Key: "sensorId", Value: "a"}}, D{{Key: "value", Value: 1}}}}}, 0)}),
			whole: []bool{false}, one: []bool{false}, match: []string{`"pipeline": [{"$match": {}}]`}},
		{name: "packed: meta only is still whole buckets", packed: true, cmd: delCmd(t, A{stmt(D{{Key: "sensorId", Value: "s1"}}, 0)}),
			whole: []bool{true}, one: []bool{false}, match: []string{`{"$match": {"meta": "s1"}},{"$project"`}},
		{name: "packed: an operator the proxy does not evaluate", packed: true, cmd: delCmd(t, A{stmt(D{{Key: "value", Value: D{{Key: "$near", Value: A{0, 0}}}}}, 0)}),
			whole: []bool{false}, one: []bool{false}, serr: []string{`"$near"`}},
		{name: "document sequence", cmd: rewrite.Command{Body: rwtest.Doc(t, D{{Key: "delete", Value: "readings"}, {Key: "$db", Value: "iot"}}),
			Sequences: []rewrite.Sequence{{Identifier: "deletes", Documents: []bsoncore.Document{rwtest.Doc(t, stmt(D{}, 0)), rwtest.Doc(t, stmt(D{}, 1))}}}},
			whole: []bool{true, true}, one: []bool{false, true}},
		{name: "limit 2", cmd: delCmd(t, A{stmt(D{}, 2)}), err: `"limit" must be 0 (all) or 1 (one)`},
		{name: "missing q", cmd: delCmd(t, A{D{{Key: "limit", Value: 0}}}), err: `missing field "q"`},
		{name: "unknown statement field", cmd: delCmd(t, A{D{{Key: "q", Value: D{}}, {Key: "limit", Value: 0}, {Key: "x", Value: 1}}}), err: `unknown field "x"`},
		{name: "other collection", cmd: rewrite.Command{Body: rwtest.Doc(t, D{{Key: "delete", Value: "other"}, {Key: "deletes", Value: A{}}})}, err: `does not match the rule's collection`},
		{name: "transaction", cmd: delCmd(t, A{stmt(D{}, 0)}, E{Key: "autocommit", Value: false}), err: "inside a transaction"},
		{name: "let", cmd: delCmd(t, A{stmt(D{}, 0)}, E{Key: "let", Value: D{{Key: "x", Value: 1}}}), whole: []bool{true}, one: []bool{false}},
		{name: "let null", cmd: delCmd(t, A{stmt(D{}, 0)}, E{Key: "let", Value: nil}), whole: []bool{true}, one: []bool{false}},
		{name: "let a number", cmd: delCmd(t, A{stmt(D{}, 0)}, E{Key: "let", Value: 1}), err: `'delete.let' is the wrong type 'int'`},
		{name: "no deletes", cmd: rewrite.Command{Body: rwtest.Doc(t, D{{Key: "delete", Value: "readings"}})}, err: `missing field "deletes"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			caps := rwtest.MongoCaps
			if c.ferret || c.packed {
				caps = rwtest.FerretCaps
				caps.PackedEvents = c.packed
			}
			p, err := NewRequest(c.cmd, rwtest.Rule(), Options{Caps: caps})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Statements) != len(c.whole) {
				t.Fatalf("%d statements, want %d", len(p.Statements), len(c.whole))
			}
			for i, st := range p.Statements {
				if st.Index != i || st.LimitOne != c.one[i] {
					t.Fatalf("statement %d: index %d limitOne %v", i, st.Index, st.LimitOne)
				}
				if c.serr != nil && c.serr[i] != "" {
					if st.Err == nil || !strings.Contains(st.Err.Error(), c.serr[i]) || !strings.Contains(st.Err.Error(), "tsproxy rule iot.readings") {
						t.Fatalf("statement %d: err %v, want %q", i, st.Err, c.serr[i])
					}
					continue
				}
				if st.Err != nil {
					t.Fatalf("statement %d: %v", i, st.Err)
				}
				if st.Whole != c.whole[i] || st.Scan != (c.packed && !st.Whole) {
					t.Fatalf("statement %d: whole %v scan %v", i, st.Whole, st.Scan)
				}
				if c.packed && strings.Contains(rwtest.JSON(st.Match), "$unwind") {
					t.Fatalf("statement %d unwinds on an upstream that cannot see events: %s", i, rwtest.JSON(st.Match))
				}
				if c.match != nil && !strings.Contains(rwtest.JSON(st.Match), c.match[i]) {
					t.Fatalf("statement %d match:\n%s\nwant it to contain\n%s", i, rwtest.JSON(st.Match), c.match[i])
				}
				if strings.Contains(rwtest.JSON(st.Match), "txnNumber") {
					t.Fatalf("txnNumber carried: %s", rwtest.JSON(st.Match))
				}
			}
		})
	}
}

// delBucket is a stored bucket of key (meta, start) at seq with events.
func delBucket(t *testing.T, meta any, start int64, seq int, events ...D) (bson.ObjectID, []byte) {
	t.Helper()
	id := rwtest.BucketID(t, meta, start, seq)
	arr := A{}
	for _, e := range events {
		arr = append(arr, e)
	}
	return id, rwtest.Doc(t, D{{Key: "_id", Value: id}, {Key: "meta", Value: meta}, {Key: "start", Value: rwtest.DT(start)}, {Key: "count", Value: len(events)}, {Key: "events", Value: arr}})
}

func TestDeleteEdit(t *testing.T) {
	rule := rwtest.InsertRule()
	rule.MaxEvents = 100
	e1 := rwtest.Stored(rwtest.OID(1), rwtest.DT(1000), true, 5.0)
	e2 := rwtest.Stored(rwtest.OID(2), rwtest.DT(2000), true, 7)
	e3 := rwtest.Stored(rwtest.OID(3), rwtest.DT(3000), true, 1.5)
	id, bdoc := delBucket(t, "s1", 0, 1, e1, e2, e3, e1)
	plan, err := NewRequest(rewrite.Command{Body: rwtest.Doc(t, D{{Key: "delete", Value: "readings"}, {Key: "deletes", Value: A{stmt(D{{Key: "value", Value: D{{Key: "$gt", Value: 6}}}}, 0)}}, {Key: "$db", Value: "iot"}})}, rule, Options{Caps: rwtest.MongoCaps})
	if err != nil {
		t.Fatal(err)
	}
	st := plan.Statements[0]
	mkCands := func(whole bool, matched ...D) *Candidates {
		c := &Candidates{whole: whole, byID: map[bson.ObjectID]*Candidate{}}
		var docs []D
		for _, m := range matched {
			docs = append(docs, D{{Key: "_id", Value: id}, {Key: "events", Value: m}})
		}
		if whole {
			docs = []D{{{Key: "_id", Value: id}, {Key: "meta", Value: "s1"}, {Key: "start", Value: rwtest.DT(0)}}}
		}
		if next, err := c.Feed(rwtest.CursorReply(t, 0, docs...)); err != nil || next != 0 {
			t.Fatalf("feed: %v %d", err, next)
		}
		return c
	}
	cases := []struct {
		name      string
		cands     *Candidates
		one       bool
		removed   int
		remaining []D
	}{
		{"one event matches", mkCands(false, e2), false, 1, []D{e1, e3, e1}},
		{"both copies of a duplicate", mkCands(false, e1, e1), false, 2, []D{e2, e3}},
		{"limit 1 removes one copy", mkCands(false, e1, e1), true, 1, []D{e2, e3, e1}},
		{"all match: shell", mkCands(false, e1, e2, e3, e1), false, 4, nil},
		{"whole bucket", mkCands(true), false, 4, nil},
		{"whole bucket, limit 1", mkCands(true), true, 1, []D{e2, e3, e1}},
		{"matched event no longer there", mkCands(false, rwtest.Stored(rwtest.OID(9), rwtest.DT(1), true, 1.0)), false, 0, []D{e1, e2, e3, e1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if len(c.cands.List) != 1 || !c.cands.List[0].HasKey == c.cands.whole {
				t.Fatalf("candidates: %+v", c.cands.List)
			}
			cand := c.cands.List[0]
			if !cand.HasKey {
				if err := cand.SetBucket(bdoc); err != nil {
					t.Fatal(err)
				}
			}
			if c.one {
				c.cands.KeepFirst()
			}
			e, err := plan.Edit(cand, bdoc, c.one)
			if err != nil {
				t.Fatal(err)
			}
			if e.ID != id || e.Seq != 1 || e.Removed != c.removed || e.Remaining != len(c.remaining) || e.OldCount != 4 {
				t.Fatalf("edit: %+v", e)
			}
			if e.Key.String() != bucket.KeyOf(bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "s1")}, 0).String() {
				t.Fatal("wrong key")
			}
			var want D
			if len(c.remaining) == 0 {
				want = D{{Key: "meta", Value: "s1"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "count", Value: 0}, {Key: "bytes", Value: 0},
					{Key: "min", Value: D{}}, {Key: "max", Value: D{}}, {Key: "events", Value: A{}}}
			} else {
				// What a fresh insert of the remaining events builds.
				var evs []bucket.Event
				for _, r := range c.remaining {
					evs = append(evs, plan.storedToEvent(rwtest.Doc(t, r), bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "s1")}, 0))
				}
				lim, _ := bucket.LimitsOf(rule)
				var full D
				if err := bson.Unmarshal(bucket.Complete(id, evs, rule, lim), &full); err != nil {
					t.Fatal(err)
				}
				want = full[1:]
			}
			rwtest.AssertDoc(t, "replacement", e.Replacement, want)
		})
	}
	// The recomputed summaries, spelled out for one case.
	e, _ := plan.Edit(mkCands(false, e2).List[0], bdoc, false)
	var got D
	_ = bson.Unmarshal(e.Replacement, &got)
	m := map[string]any{}
	for _, e := range got {
		m[e.Key] = e.Value
	}
	if m["count"] != int32(3) || rwtest.JSON(rwtest.Doc(t, m["min"])) != `{"ts": {"$date":{"$numberLong":"1000"}},"value": {"$numberDouble":"1.5"}}` ||
		rwtest.JSON(rwtest.Doc(t, m["max"])) != `{"ts": {"$date":{"$numberLong":"3000"}},"value": {"$numberDouble":"5.0"}}` ||
		rwtest.JSON(rwtest.Doc(t, m["sum"])) != `{"value": {"$numberDouble":"11.5"}}` {
		t.Fatalf("summaries: %v", got)
	}

	// A bucket whose _id is not of its key's family is refused.
	_, foreign := delBucket(t, "s1", 0, 0, e1)
	foreign = rwtest.Doc(t, append(D{{Key: "_id", Value: rwtest.OID(77)}}, func() D { var d D; _ = bson.Unmarshal(foreign, &d); return d[1:] }()...))
	c := mkCands(true)
	c.List[0].ID = rwtest.OID(77)
	if _, err := plan.Edit(c.List[0], foreign, false); err == nil || !strings.Contains(err.Error(), "not one the proxy wrote") {
		t.Fatalf("foreign bucket: %v", err)
	}
	_ = st
}

func TestDeleteCandidates(t *testing.T) {
	b1, b2 := rwtest.OID(1), rwtest.OID(2)
	ev := func(n int) D { return D{{Key: "_id", Value: n}, {Key: "ts", Value: rwtest.DT(int64(n))}} }
	c := &Candidates{byID: map[bson.ObjectID]*Candidate{}}
	next, err := c.Feed(rwtest.CursorReply(t, 42, D{{Key: "_id", Value: b1}, {Key: "events", Value: ev(1)}}, D{{Key: "_id", Value: b2}, {Key: "events", Value: ev(2)}}))
	if err != nil || next != 42 {
		t.Fatalf("first batch: %d %v", next, err)
	}
	getMore := rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "nextBatch", Value: A{D{{Key: "_id", Value: b1}, {Key: "events", Value: ev(3)}}}}, {Key: "id", Value: int64(0)}}}, {Key: "ok", Value: 1.0}})
	if next, err = c.Feed(getMore); err != nil || next != 0 {
		t.Fatalf("next batch: %d %v", next, err)
	}
	if len(c.List) != 2 || c.List[0].ID != b1 || len(c.List[0].order) != 2 || c.List[1].HasKey {
		t.Fatalf("candidates: %+v", c.List)
	}
	// An upstream whose $unwind keeps meta and start gives the key.
	withKey := &Candidates{byID: map[bson.ObjectID]*Candidate{}}
	if _, err := withKey.Feed(rwtest.CursorReply(t, 0, D{{Key: "_id", Value: b1}, {Key: "meta", Value: "s"}, {Key: "start", Value: rwtest.DT(rwtest.Hour)}, {Key: "events", Value: ev(1)}})); err != nil {
		t.Fatal(err)
	}
	if k := withKey.List[0]; !k.HasKey || k.Key.Start != rwtest.Hour || string(k.Key.Meta[1:]) != string(bsoncore.AppendString(nil, "s")) {
		t.Fatalf("key from the match: %+v", k)
	}
	c.KeepFirst()
	if len(c.List) != 1 || len(c.List[0].match) != 1 || c.List[0].match[string(rwtest.Doc(t, ev(1)))] != 1 {
		t.Fatalf("after KeepFirst: %+v", c.List[0])
	}
	// Upstream errors keep their code.
	_, err = c.Feed(rwtest.Doc(t, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "boom"}, {Key: "code", Value: 2}}))
	var ce *mongoerr.Error
	if err == nil || !asCommandError(err, &ce) || ce.Code != 2 || ce.Msg != "boom" {
		t.Fatalf("error reply: %v", err)
	}
	if _, err := c.Feed(rwtest.CursorReply(t, 0, D{{Key: "events", Value: ev(1)}})); err == nil {
		t.Fatal("a match result without bucket _id was accepted")
	}
}

// A scan statement's candidates are the matching events of the whole
// buckets its match command lists, packed or not; a deleteOne stops at
// the first.
func TestDeleteCandidatesScan(t *testing.T) {
	ev := func(n int, v int) D {
		return D{{Key: "_id", Value: n}, {Key: "ts", Value: rwtest.DT(int64(n))}, {Key: "sensorId", Value: nil}, {Key: "value", Value: v}}
	}
	_, packed, err := bson.MarshalValue(A{ev(1, 5), ev(2, 50), ev(3, 60)})
	if err != nil {
		t.Fatal(err)
	}
	b1 := D{{Key: "_id", Value: rwtest.OID(1)}, {Key: "meta", Value: "a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "count", Value: 3}, {Key: "packed", Value: bson.Binary{Data: packed}}}
	b2 := D{{Key: "_id", Value: rwtest.OID(2)}, {Key: "meta", Value: "b"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "count", Value: 2}, {Key: "events", Value: A{ev(4, 1), ev(5, 70)}}}
	c := packedCaps()
	for _, one := range []int{0, 1} {
		p, err := NewRequest(delCmd(t, A{stmt(D{{Key: "value", Value: D{{Key: "$gte", Value: 50}}}}, one)}), rwtest.Rule(), Options{Caps: c})
		if err != nil {
			t.Fatal(err)
		}
		st := p.Statements[0]
		cands := st.NewCandidates()
		if _, err := cands.Feed(rwtest.CursorReply(t, 0, b1, b2)); err != nil {
			t.Fatal(err)
		}
		matched := 0
		for _, cand := range cands.List {
			if !cand.HasKey {
				t.Fatalf("candidate %v without its key", cand.ID)
			}
			matched += len(cand.order)
		}
		if want := map[int]int{0: 3, 1: 1}[one]; matched != want || len(cands.List) != map[int]int{0: 2, 1: 1}[one] {
			t.Fatalf("limit %d: %d events in %d buckets, want %d", one, matched, len(cands.List), want)
		}
	}
}

func packedCaps() caps.Upstream {
	c := rwtest.FerretCaps
	c.PackedEvents = true
	return c
}

func asCommandError(err error, out **mongoerr.Error) bool {
	ce, ok := err.(*mongoerr.Error)
	*out = ce
	return ok
}

func TestDeleteWrites(t *testing.T) {
	plan, err := NewRequest(delCmd(t, A{stmt(D{}, 0)}, E{Key: "writeConcern", Value: D{{Key: "w", Value: "majority"}}}, E{Key: "txnNumber", Value: int64(1)}), rwtest.Rule(), Options{Caps: rwtest.MongoCaps})
	if err != nil {
		t.Fatal(err)
	}
	shell := bucket.Shell(bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "s")}, 0)
	up := plan.ReplaceCommand([]BucketEdit{{ID: rwtest.OID(1), Replacement: shell}})
	rwtest.AssertDoc(t, "replace", up, D{{Key: "update", Value: "readings.buckets"}, {Key: "updates", Value: A{
		D{{Key: "q", Value: D{{Key: "_id", Value: rwtest.OID(1)}}}, {Key: "u", Value: D{{Key: "meta", Value: "s"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "count", Value: 0}, {Key: "bytes", Value: 0}, {Key: "min", Value: D{}}, {Key: "max", Value: D{}}, {Key: "events", Value: A{}}}}}}},
		{Key: "ordered", Value: true}, {Key: "writeConcern", Value: D{{Key: "w", Value: "majority"}}}, {Key: "$db", Value: "iot"}})
	rm := plan.RemoveCommand([]bson.ObjectID{rwtest.OID(2), rwtest.OID(1)})
	rwtest.AssertDoc(t, "remove", rm, D{{Key: "delete", Value: "readings.buckets"}, {Key: "deletes", Value: A{
		D{{Key: "q", Value: D{{Key: "_id", Value: rwtest.OID(2)}}}, {Key: "limit", Value: 1}},
		D{{Key: "q", Value: D{{Key: "_id", Value: rwtest.OID(1)}}}, {Key: "limit", Value: 1}}}},
		{Key: "ordered", Value: true}, {Key: "writeConcern", Value: D{{Key: "w", Value: "majority"}}}, {Key: "$db", Value: "iot"}})

	cases := []struct {
		name  string
		reply D
		done  int
		err   string
	}{
		{"all", D{{Key: "n", Value: 2}, {Key: "ok", Value: 1.0}}, 2, ""},
		{"second fails", D{{Key: "n", Value: 1}, {Key: "writeErrors", Value: A{D{{Key: "index", Value: 1}, {Key: "code", Value: 11000}, {Key: "errmsg", Value: "dup"}}}}, {Key: "ok", Value: 1.0}}, 1, "dup"},
		{"command fails", D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: 13}}, 0, "no"},
		{"write concern error kept", D{{Key: "n", Value: 2}, {Key: "writeConcernError", Value: D{{Key: "code", Value: 64}, {Key: "errmsg", Value: "wc"}}}, {Key: "ok", Value: 1.0}}, 2, ""},
	}
	for _, c := range cases {
		done, err := plan.WriteOutcome(rwtest.Doc(t, c.reply), 2)
		if done != c.done || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Fatalf("%s: done %d err %v", c.name, done, err)
		}
	}
	reply := plan.Reply(5, []StatementError{{Index: 2, Err: mongoerr.Errorf(mongoerr.NotImplemented, "x")}, {Index: 0, Err: mongoerr.Errorf(mongoerr.BadValue, "y")}})
	rwtest.AssertDoc(t, "reply", reply, D{{Key: "n", Value: 5}, {Key: "writeErrors", Value: A{
		D{{Key: "index", Value: 0}, {Key: "code", Value: 2}, {Key: "errmsg", Value: "y"}},
		D{{Key: "index", Value: 2}, {Key: "code", Value: 238}, {Key: "errmsg", Value: "x"}}}},
		{Key: "writeConcernError", Value: D{{Key: "code", Value: 64}, {Key: "errmsg", Value: "wc"}}}, {Key: "ok", Value: 1.0}})
}

func TestSeqOf(t *testing.T) {
	k := bucket.KeyOf(bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "s")}, 3*rwtest.Hour)
	for _, seq := range []int{0, 1, 7, 300} {
		if got, ok := bucket.SeqOf("iot.readings.buckets", k, k.ID("iot.readings.buckets", seq)); !ok || got != seq {
			t.Fatalf("seq %d: %d %v", seq, got, ok)
		}
	}
	if _, ok := bucket.SeqOf("iot.readings.buckets", k, rwtest.OID(5)); ok {
		t.Fatal("a foreign id has a seq")
	}
}

// TestPlanDeleteByID: a statement naming event _ids gets the index read
// on FerretDB (its aggregate decodes every bucket), not on MongoDB, and
// the matcher it gets finds the event in a bucket.
func TestPlanDeleteByID(t *testing.T) {
	byID := delCmd(t, A{stmt(D{{Key: "_id", Value: D{{Key: "$in", Value: A{int32(1), "b"}}}}}, 1), stmt(D{{Key: "value", Value: 1}}, 0)})
	for _, c := range []struct {
		caps caps.Upstream
		want []bool
	}{{rwtest.FerretCaps, []bool{true, false}}, {rwtest.MongoCaps, []bool{false, false}}} {
		p, err := NewRequest(byID, rwtest.Rule(), Options{Caps: c.caps})
		if err != nil {
			t.Fatal(err)
		}
		for i, st := range p.Statements {
			if got := st.IDs != nil && st.Events != nil; got != c.want[i] {
				t.Fatalf("caps %+v, statement %d: index read %v, want %v", c.caps, i, got, c.want[i])
			}
		}
		if !c.want[0] {
			continue
		}
		_, b := delBucket(t, "s1", 0, 0, D{{Key: "_id", Value: int32(2)}, {Key: "ts", Value: rwtest.DT(1)}, {Key: "sensorId", Value: nil}, {Key: "value", Value: 1.0}},
			D{{Key: "_id", Value: 1.0}, {Key: "ts", Value: rwtest.DT(2)}, {Key: "sensorId", Value: nil}, {Key: "value", Value: 2.0}})
		cands := p.Statements[0].NewCandidates()
		if err := p.Statements[0].Events.Match(b, func(stored bsoncore.Document) bool {
			if err := cands.AddEvent(b, stored); err != nil {
				t.Fatal(err)
			}
			return false
		}); err != nil {
			t.Fatal(err)
		}
		if len(cands.List) != 1 || len(cands.List[0].order) != 1 || !cands.List[0].HasKey {
			t.Fatalf("candidates %+v, want the event with _id 1.0", cands.List)
		}
	}
}

// TestDeleteOptions: collation and $jsonSchema as MongoDB answers them
// (issue 55, case 7): the simple collation, or any on a filter that
// compares no string, runs; another on strings is the statement's
// error; a malformed collation fails the command; a $jsonSchema that is
// not a document is TypeMismatch.
func TestDeleteOptions(t *testing.T) {
	withColl := func(q D, coll any) D {
		return D{{Key: "q", Value: q}, {Key: "limit", Value: 0}, {Key: "collation", Value: coll}}
	}
	fr := D{{Key: "locale", Value: "fr"}, {Key: "strength", Value: 2}}
	cases := []struct {
		name string
		st   D
		serr string        // the statement's error
		code mongoerr.Code // its code, or the command's
		err  string        // the command's error
	}{
		{name: "simple collation", st: withColl(D{{Key: "value", Value: "x"}}, D{{Key: "locale", Value: "simple"}})},
		{name: "null collation", st: withColl(D{{Key: "value", Value: "x"}}, nil)},
		{name: "other collation, numbers only", st: withColl(D{{Key: "value", Value: D{{Key: "$gt", Value: 5}}}}, fr)},
		{name: "other collation, a regex and a type name", st: withColl(D{{Key: "value", Value: D{{Key: "$regex", Value: "^a"}, {Key: "$type", Value: "string"}}}}, fr)},
		{name: "other collation, a string", st: withColl(D{{Key: "value", Value: D{{Key: "$in", Value: A{1, "a"}}}}}, fr), serr: "compares strings", code: mongoerr.NotImplemented},
		{name: "other collation, a metaField string", st: withColl(D{{Key: "sensorId", Value: "s1"}}, fr), serr: "compares strings", code: mongoerr.NotImplemented},
		{name: "collation a string", st: withColl(D{}, "fr"), err: "'delete.deletes.collation' is the wrong type 'string'", code: mongoerr.TypeMismatch},
		{name: "collation without locale", st: withColl(D{}, D{{Key: "strength", Value: 1}}), err: "'collation.locale' is missing", code: mongoerr.IDLFailedToParse},
		{name: "collation unknown field", st: withColl(D{}, D{{Key: "locale", Value: "fr"}, {Key: "colour", Value: 1}}), err: "'collation.colour' is an unknown field", code: mongoerr.IDLUnknownField},
		{name: "$jsonSchema not a document", st: stmt(D{{Key: "$jsonSchema", Value: 1}}, 0), serr: "$jsonSchema must be an object", code: mongoerr.TypeMismatch},
		{name: "$jsonSchema in $and not a document", st: stmt(D{{Key: "$and", Value: A{D{{Key: "$jsonSchema", Value: "x"}}}}}, 0), serr: "$jsonSchema must be an object", code: mongoerr.TypeMismatch},
		{name: "$jsonSchema unknown keyword", st: stmt(D{{Key: "$jsonSchema", Value: D{{Key: "colour", Value: 1}}}}, 0), serr: "Unknown $jsonSchema keyword: colour", code: mongoerr.FailedToParse},
		{name: "$jsonSchema unsupported keyword", st: stmt(D{{Key: "$jsonSchema", Value: D{{Key: "$ref", Value: "x"}}}}, 0), serr: "'$ref' is not currently supported", code: mongoerr.FailedToParse},
		{name: "$jsonSchema valid: not evaluated", st: stmt(D{{Key: "$jsonSchema", Value: D{{Key: "required", Value: A{"value"}}}}}, 0), serr: "$jsonSchema", code: mongoerr.NotImplemented},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewRequest(delCmd(t, A{c.st}), rwtest.Rule(), Options{Caps: rwtest.MongoCaps})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || mongoerr.CodeOf(err) != c.code {
					t.Fatalf("err %v, want code %d with %q", err, c.code, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			st := p.Statements[0]
			if c.serr == "" {
				if st.Err != nil || st.Match == nil {
					t.Fatalf("statement error %v, match %s; want it planned", st.Err, st.Match)
				}
				return
			}
			if st.Err == nil || !strings.Contains(st.Err.Error(), c.serr) || mongoerr.CodeOf(st.Err) != c.code {
				t.Fatalf("statement error %v, want code %d with %q", st.Err, c.code, c.serr)
			}
		})
	}
}
