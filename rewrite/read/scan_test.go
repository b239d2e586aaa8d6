package read

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

func TestScanPlan(t *testing.T) {
	ts := func(ops ...E) E { return E{Key: "ts", Value: D(ops)} }
	cases := []struct {
		name   string
		filter D
		sort   D
		caps   *caps.Upstream
		why    string // fallback reason (substring); "" = scan plan
		find   string // the upstream filter and sort, as JSON fragments
		empty  bool   // the plan reads nothing
	}{
		{name: "one day asc", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(rwtest.Hour + 5)}, E{Key: "$lt", Value: rwtest.DT(25 * rwtest.Hour)})}, sort: D{{Key: "ts", Value: 1}},
			find: `"filter": {"start": {"$gte": {"$date": {"$numberLong": "3600000"}},"$lt": {"$date": {"$numberLong": "90000000"}}}},"sort": {"start": {"$numberInt":"1"}}`},
		{name: "desc with _id tie-break, $lte", filter: D{ts(E{Key: "$gt", Value: rwtest.DT(0)}, E{Key: "$lte", Value: rwtest.DT(2 * rwtest.Hour)})}, sort: D{{Key: "ts", Value: -1}, {Key: "_id", Value: 1}},
			find: `"filter": {"start": {"$gte": {"$date": {"$numberLong": "0"}},"$lte": {"$date": {"$numberLong": "7200000"}}}},"sort": {"start": {"$numberInt":"-1"}}`},
		{name: "half-bounded below", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(-rwtest.Hour - 1)})},
			find: `"filter": {"start": {"$gte": {"$date": {"$numberLong": "-7200000"}}}},"sort": {"start": {"$numberInt":"1"}}`},
		{name: "half-bounded above", filter: D{ts(E{Key: "$lt", Value: rwtest.DT(rwtest.Hour)})},
			find: `"filter": {"start": {"$lt": {"$date": {"$numberLong": "3600000"}}}}`},
		{name: "bare date: one window, an equality on start", filter: D{{Key: "ts", Value: rwtest.DT(rwtest.Hour + 1)}},
			find: `"filter": {"start": {"$date": {"$numberLong": "3600000"}}}`},
		{name: "range inside one window", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(rwtest.Hour + 5)}, E{Key: "$lt", Value: rwtest.DT(2 * rwtest.Hour)})},
			find: `"filter": {"start": {"$date": {"$numberLong": "3600000"}}}`},
		{name: "range ending at the next window, inclusive", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(rwtest.Hour + 5)}, E{Key: "$lte", Value: rwtest.DT(2 * rwtest.Hour)})},
			find: `"filter": {"start": {"$gte": {"$date": {"$numberLong": "3600000"}},"$lte": {"$date": {"$numberLong": "7200000"}}}}`},
		{name: "$and of bounds", filter: D{{Key: "$and", Value: A{D{ts(E{Key: "$gte", Value: rwtest.DT(0)})}, D{ts(E{Key: "$lt", Value: rwtest.DT(rwtest.Hour)})}}}},
			find: `"filter": {"start": {"$date": {"$numberLong": "0"}}}`},
		{name: "empty range", filter: D{ts(E{Key: "$gt", Value: rwtest.DT(rwtest.Hour)}, E{Key: "$lt", Value: rwtest.DT(rwtest.Hour)})}, empty: true},
		{name: "lowest date: no lower start bound", filter: D{ts(E{Key: "$gte", Value: bson.DateTime(math.MinInt64)})},
			find: `"filter": {},"sort": {"start": {"$numberInt":"1"}}`},

		{name: "MongoDB upstream keeps the aggregate", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(0)})}, caps: &rwtest.MongoCaps, why: "keeps the meta"},
		{name: "no filter", why: "no filter"},
		{name: "unbounded", filter: D{ts(E{Key: "$exists", Value: true})}, why: "$exists with a bool"},
		{name: "meta condition", filter: D{{Key: "sensorId", Value: int32(7)}, ts(E{Key: "$gte", Value: rwtest.DT(0)})}, why: `"sensorId"`},
		{name: "residual field", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(0)}), {Key: "v", Value: 1}}, why: `"v"`},
		{name: "$or", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(0)}), {Key: "$or", Value: A{D{{Key: "v", Value: 1}}}}}, why: `"$or"`},
		{name: "ts $in", filter: D{ts(E{Key: "$in", Value: A{rwtest.DT(0)}})}, why: "array"},
		{name: "ts compared to a number", filter: D{ts(E{Key: "$gte", Value: 0})}, why: "$gte with a int"},
		{name: "sort on a field", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(0)})}, sort: D{{Key: "v", Value: 1}}, why: `sort on "v"`},
		{name: "sort ts then field", filter: D{ts(E{Key: "$gte", Value: rwtest.DT(0)})}, sort: D{{Key: "ts", Value: 1}, {Key: "v", Value: 1}}, why: "more than the timeField"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			caps := rwtest.FerretCaps
			if c.caps != nil {
				caps = *c.caps
			}
			rc := rwtest.Ctx(t, caps)
			var f, s bsoncore.Document
			if c.filter != nil {
				f = rwtest.Doc(t, c.filter)
			}
			if c.sort != nil {
				s = rwtest.Doc(t, c.sort)
			}
			spec, sc, why := point.PlanScan(rc, f, s)
			if c.why != "" {
				if spec != nil || !strings.Contains(why, c.why) {
					t.Fatalf("got a plan, why %q; want a fallback because %q", why, c.why)
				}
				return
			}
			if spec == nil {
				t.Fatalf("no scan plan: %s", why)
			}
			pr := point.NewScanRead(rc, spec, sc, nil, 0, 0, false)
			cmds := pr.Lookups()
			if c.empty {
				if cmds != nil || !pr.Exhausted() {
					t.Fatalf("an empty range sends %d commands", len(cmds))
				}
				return
			}
			if len(cmds) != 1 {
				t.Fatalf("%d commands, want the one find", len(cmds))
			}
			got := rwtest.JSON(cmds[0])
			if !strings.Contains(strings.Join(strings.Fields(got), ""), strings.Join(strings.Fields(c.find), "")) || !strings.Contains(got, `"find": "readings.buckets"`) || !strings.Contains(got, `"$db": "iot"`) {
				t.Fatalf("find %s\nwant %s", got, c.find)
			}
		})
	}
}

// The planning hook: a time-only find takes the scan, a fixed meta the
// point lookups, anything else the aggregate; explain shows which.
func TestScanPlanHook(t *testing.T) {
	rng := E{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}
	for _, c := range []struct {
		filter D
		stage  string
	}{
		{D{rng}, "TSPROXY_BUCKET_SCAN"},
		{D{{Key: "sensorId", Value: "a"}, rng}, "TSPROXY_BUCKET_ID_LOOKUPS"},
		{D{{Key: "v", Value: 1}, rng}, ""},
	} {
		find := D{{Key: "find", Value: "readings"}, {Key: "filter", Value: c.filter}}
		plan, err := rdPlan(t, rwtest.FerretCaps, D{{Key: "explain", Value: find}})
		if err != nil {
			t.Fatal(err)
		}
		if c.stage == "" {
			if !plan.Passthrough {
				t.Fatalf("%v: not the aggregate path", c.filter)
			}
			continue
		}
		if st, _ := bsoncore.Document(plan.Local).Lookup("queryPlanner", "winningPlan", "stage").StringValueOK(); st != c.stage {
			t.Fatalf("%v: explain %s, want stage %s", c.filter, rwtest.JSON(plan.Local), c.stage)
		}
		// The upstream's plan of the first command sent is asked for and
		// shown beside the proxy's.
		target := bsoncore.Document(plan.LocalExplain)
		if coll, _ := target.Lookup("explain", "find").StringValueOK(); coll != "readings.buckets" {
			t.Fatalf("%v: upstream explain %s, want one of a find on readings.buckets", c.filter, rwtest.JSON(plan.LocalExplain))
		}
		if db, _ := target.Lookup("$db").StringValueOK(); db != "iot" {
			t.Fatalf("%v: upstream explain %s without $db iot", c.filter, rwtest.JSON(plan.LocalExplain))
		}
		upReply := rwtest.Doc(t, D{{Key: "queryPlanner", Value: D{{Key: "winningPlan", Value: D{{Key: "stage", Value: "IDHACK"}}}}}, {Key: "ok", Value: 1.0}})
		merged := bsoncore.Document(cursor.WithUpstreamPlan(plan.Local, upReply))
		if st, _ := merged.Lookup("queryPlanner", "upstreamPlan", "winningPlan", "stage").StringValueOK(); st != "IDHACK" {
			t.Fatalf("%v: merged explain %s lacks the upstream plan", c.filter, rwtest.JSON(merged))
		}
		if st, _ := merged.Lookup("queryPlanner", "winningPlan", "stage").StringValueOK(); st != c.stage {
			t.Fatalf("%v: merged explain %s lost the proxy's stage", c.filter, rwtest.JSON(merged))
		}
		errReply := rwtest.Doc(t, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}})
		if m, _ := bsoncore.Document(cursor.WithUpstreamPlan(plan.Local, errReply)).Lookup("queryPlanner", "upstreamPlan", "errmsg").StringValueOK(); m != "no" {
			t.Fatalf("%v: an upstream explain error is not shown", c.filter)
		}
	}
}

// scanBuckets is an upstream bucket collection answering the scan's find
// and getMores: buckets of one start come in an arbitrary order (here
// reversed seqs and metas), as an in-memory sort on start leaves them.
type scanBuckets struct {
	all     []bsoncore.Document
	rest    []bsoncore.Document // of the open cursor
	batches int
	killed  bool
}

func (sb *scanBuckets) reply(t *testing.T, cmd []byte) []byte {
	t.Helper()
	d := bsoncore.Document(cmd)
	key := "nextBatch"
	if _, err := d.LookupErr("find"); err == nil {
		key = "firstBatch"
		f := d.Lookup("filter", "start")
		dir := d.Lookup("sort", "start").Int32()
		sb.rest = nil
		for _, b := range sb.all {
			st := b.Lookup("start").DateTime()
			if eq, ok := f.DateTimeOK(); ok {
				if st == eq {
					sb.rest = append(sb.rest, b)
				}
				continue
			}
			if v, err := f.Document().LookupErr("$gte"); err == nil && st < v.DateTime() {
				continue
			}
			if v, err := f.Document().LookupErr("$lt"); err == nil && st >= v.DateTime() {
				continue
			}
			if v, err := f.Document().LookupErr("$lte"); err == nil && st > v.DateTime() {
				continue
			}
			sb.rest = append(sb.rest, b)
		}
		slices.SortStableFunc(sb.rest, func(a, b bsoncore.Document) int {
			return int(dir) * int(a.Lookup("start").DateTime()-b.Lookup("start").DateTime()) / int(rwtest.Hour)
		})
	} else if d.Lookup("getMore").Int64() != 7 {
		t.Fatalf("getMore of cursor %s", d.Lookup("getMore"))
	}
	n := int(d.Lookup("batchSize").Int32())
	n = min(n, len(sb.rest))
	batch := A{}
	for _, b := range sb.rest[:n] {
		batch = append(batch, bson.Raw(b))
	}
	sb.rest = sb.rest[n:]
	sb.batches++
	id := int64(7)
	if len(sb.rest) == 0 {
		id = 0
	}
	return rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: key, Value: batch}, {Key: "id", Value: id}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
}

// TestScanReadResults checks a scan read against a brute-force filter and
// sort of the same events: 3 series x 8 windows x 3 seqs (more buckets
// than one upstream batch), events out of order inside a bucket and tied
// across series, bounds inside windows, skip, limit, small batches.
func TestScanReadResults(t *testing.T) {
	rule := rwtest.Rule()
	sb := &scanBuckets{}
	var all []ptEvent
	id := int32(0)
	metas := []any{"a", "b", "<none>"}
	for w := int64(0); w < 8; w++ {
		for mi := len(metas) - 1; mi >= 0; mi-- {
			meta := metas[mi]
			for seq := 2; seq >= 0; seq-- {
				var evs A
				for i := 0; i < 5; i++ {
					id++
					ms := w*rwtest.Hour + int64((7*i+3*seq)%15)*60_000
					all = append(all, ptEvent{meta: meta, ms: ms, id: id})
					evs = append(evs, D{{Key: "_id", Value: id}, {Key: "ts", Value: rwtest.DT(ms)}, {Key: "sensorId", Value: nil}, {Key: "v", Value: int32(i)}})
				}
				var mv any = meta
				if meta == "<none>" {
					mv = nil
				}
				sb.all = append(sb.all, rwtest.Doc(t, D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "meta", Value: mv}, {Key: "start", Value: rwtest.DT(w * rwtest.Hour)}, {Key: "count", Value: 5}, {Key: "events", Value: evs}}))
			}
		}
	}
	// an emptied shell
	sb.all = append(sb.all, rwtest.Doc(t, D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "meta", Value: "a"}, {Key: "start", Value: rwtest.DT(3 * rwtest.Hour)}, {Key: "count", Value: 0}}))
	_ = rule
	const none = math.MinInt64
	cases := []struct {
		name        string
		lo, hi      int64 // none: unbounded
		sortDir     int
		skip, limit int64
		batch       int64
		zeroFirst   bool
		openAfter   bool // the upstream cursor is still open at the end
	}{
		{name: "unsorted", lo: 20 * 60_000, hi: 5*rwtest.Hour + 5*60_000},
		{name: "asc whole range", lo: 0, hi: 8 * rwtest.Hour, sortDir: 1},
		{name: "desc skip limit", lo: 1, hi: 8 * rwtest.Hour, sortDir: -1, skip: 7, limit: 11, batch: 4, openAfter: true},
		{name: "asc batch 3", lo: 2 * rwtest.Hour, hi: 4*rwtest.Hour + 1, sortDir: 1, batch: 3},
		{name: "open above desc", lo: 5*rwtest.Hour + 1, hi: none, sortDir: -1, batch: 1000},
		{name: "open below asc past the first batch", lo: none, hi: 6 * rwtest.Hour, sortDir: 1},
		{name: "limit beyond results", lo: 0, hi: 3 * rwtest.Hour, sortDir: 1, limit: 10_000},
		{name: "batchSize 0 first", lo: 0, hi: 2 * rwtest.Hour, sortDir: -1, zeroFirst: true},
		{name: "empty", lo: 100 * rwtest.Hour, hi: 101 * rwtest.Hour, sortDir: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var bounds D
			lo, hi := c.lo, c.hi
			if lo != none {
				bounds = append(bounds, E{Key: "$gte", Value: rwtest.DT(lo)})
			}
			if hi != none {
				bounds = append(bounds, E{Key: "$lt", Value: rwtest.DT(hi)})
			} else {
				hi = math.MaxInt64
			}
			cmd := pagedFind(D{{Key: "ts", Value: bounds}}, c.sortDir, c.skip, c.limit, c.batch, c.zeroFirst)
			plan, err := rdPlan(t, rwtest.FerretCaps, cmd)
			if err != nil {
				t.Fatal(err)
			}
			if plan.Point == nil || plan.Point.Scan == nil {
				t.Fatal("no scan plan")
			}
			sb.batches = 0
			got := drainPoint(t, plan.Point, sb, c.batch)
			want := expectPoint(all, A{"a", "b", nil}, lo, hi, c.sortDir, c.skip, c.limit)
			if c.sortDir == 0 {
				slices.Sort(got)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got  %v\nwant %v", got, want)
			}
			if c.name != "empty" && len(got) == 0 {
				t.Fatal("no results")
			}
			if open := plan.Point.OpenUpstreamCursor() != 0; open != c.openAfter {
				t.Fatalf("upstream cursor open at the end: %v, want %v", open, c.openAfter)
			}
			plan.Point.UpstreamCursorClosed()
			if plan.Point.OpenUpstreamCursor() != 0 {
				t.Fatal("upstream cursor still open once closed")
			}
		})
	}
}
