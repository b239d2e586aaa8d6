package read

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

// sortedBuckets answers an event scan's find and getMores as a server
// would: the meta $in and start bounds of the filter, the sort on any
// bucket paths (BSON order), then batches.
type sortedBuckets struct {
	all  []bsoncore.Document
	rest []bsoncore.Document
	// reorder, when set, changes the sorted buckets (a server whose order
	// differs).
	reorder func([]bsoncore.Document)
	killed  int // killCursors received
}

func (sb *sortedBuckets) reply(t *testing.T, cmd []byte) []byte {
	t.Helper()
	d := bsoncore.Document(cmd)
	if _, err := d.LookupErr("killCursors"); err == nil {
		sb.killed++
		sb.rest = nil
		return rwtest.Doc(t, D{{Key: "ok", Value: 1.0}})
	}
	key := "nextBatch"
	if _, err := d.LookupErr("find"); err == nil {
		key = "firstBatch"
		sb.rest = nil
		f := d.Lookup("filter")
		for _, b := range sb.all {
			if sb.selects(f.Document(), b) {
				sb.rest = append(sb.rest, b)
			}
		}
		keys, _ := d.Lookup("sort").Document().Elements()
		slices.SortStableFunc(sb.rest, func(a, b bsoncore.Document) int {
			for _, k := range keys {
				path := strings.Split(k.Key(), ".")
				if c := bsonutil.Compare(point.SortValue(a, path), point.SortValue(b, path)); c != 0 {
					return c * int(k.Value().Int32())
				}
			}
			return 0
		})
		if sb.reorder != nil {
			sb.reorder(sb.rest)
		}
	}
	n := min(int(d.Lookup("batchSize").Int32()), len(sb.rest))
	batch := A{}
	for _, b := range sb.rest[:n] {
		batch = append(batch, bson.Raw(b))
	}
	sb.rest = sb.rest[n:]
	id := int64(7)
	if len(sb.rest) == 0 {
		id = 0
	}
	return rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: key, Value: batch}, {Key: "id", Value: id}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
}

func (sb *sortedBuckets) selects(f bsoncore.Document, b bsoncore.Document) bool {
	if in, err := f.LookupErr("meta", "$in"); err == nil {
		vals, _ := in.Array().Values()
		if !slices.ContainsFunc(vals, func(v bsoncore.Value) bool { return bsonutil.Compare(v, b.Lookup("meta")) == 0 }) {
			return false
		}
	}
	st := b.Lookup("start").DateTime()
	if eq, ok := f.Lookup("start").DateTimeOK(); ok && st != eq {
		return false
	}
	if v, err := f.LookupErr("start", "$gte"); err == nil && st < v.DateTime() {
		return false
	}
	if v, err := f.LookupErr("start", "$lt"); err == nil && st >= v.DateTime() {
		return false
	}
	if v, err := f.LookupErr("start", "$lte"); err == nil && st > v.DateTime() {
		return false
	}
	return true
}

// esEvent is one event of the event scan tests.
type esEvent struct {
	site string
	n    int32
	ms   int64
	id   int32
	v    int32
}

// eventScanData: 4 series (document metas {site, n}) x 10 windows x 2
// seqs x 5 events (more buckets than one upstream batch), out of time order inside a bucket, buckets of a window in
// no particular order.
func eventScanData(t *testing.T) (*sortedBuckets, []esEvent) {
	sb := &sortedBuckets{}
	var all []esEvent
	id := int32(0)
	series := []struct {
		site string
		n    int32
	}{{"south", 2}, {"north", 1}, {"south", 1}, {"north", 2}}
	for w := int64(0); w < 10; w++ {
		for _, s := range series {
			for seq := 1; seq >= 0; seq-- {
				var evs A
				for i := 0; i < 5; i++ {
					id++
					ms := w*rwtest.Hour + int64((7*i+3*seq)%15)*60_000
					v := (id * 7) % 11
					all = append(all, esEvent{site: s.site, n: s.n, ms: ms, id: id, v: v})
					evs = append(evs, D{{Key: "_id", Value: id}, {Key: "ts", Value: rwtest.DT(ms)}, {Key: "sensorId", Value: nil}, {Key: "v", Value: v}})
				}
				meta := D{{Key: "site", Value: s.site}, {Key: "n", Value: s.n}}
				sb.all = append(sb.all, rwtest.Doc(t, D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "meta", Value: meta}, {Key: "start", Value: rwtest.DT(w * rwtest.Hour)}, {Key: "count", Value: 5}, {Key: "events", Value: evs}}))
			}
		}
	}
	return sb, all
}

// TestEventScanResults checks finds the upstream cannot run on unwound
// events (sorts naming the metaField, the metaField inside $or) against a
// brute-force filter and sort of the same events.
func TestEventScanResults(t *testing.T) {
	sb, all := eventScanData(t)
	metaCmp := func(a, b esEvent) int { return cmp.Or(cmp.Compare(a.site, b.site), cmp.Compare(a.n, b.n)) }
	tsRange := D{{Key: "$gte", Value: rwtest.DT(rwtest.Hour + 60_000)}, {Key: "$lt", Value: rwtest.DT(4 * rwtest.Hour)}}
	inRange := func(e esEvent) bool { return e.ms >= rwtest.Hour+60_000 && e.ms < 4*rwtest.Hour }
	cases := []struct {
		name        string
		filter      D
		sort        D
		match       func(esEvent) bool
		less        func(a, b esEvent) int
		skip, limit int64
		batch       int64
		order       string // the scan's order (explain)
	}{
		{name: "time then series", filter: D{{Key: "ts", Value: tsRange}}, sort: D{{Key: "ts", Value: 1}, {Key: "sensorId", Value: 1}},
			match: inRange, less: func(a, b esEvent) int { return cmp.Or(cmp.Compare(a.ms, b.ms), metaCmp(a, b)) }, order: "each window's"},
		{name: "series then time", sort: D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1}},
			less: func(a, b esEvent) int { return cmp.Or(metaCmp(a, b), cmp.Compare(a.ms, b.ms)) }, batch: 7, order: "meta keys then start"},
		{name: "series desc, time desc, paged", filter: D{{Key: "ts", Value: tsRange}}, sort: D{{Key: "sensorId", Value: -1}, {Key: "ts", Value: -1}},
			match: inRange, less: func(a, b esEvent) int { return cmp.Or(metaCmp(b, a), cmp.Compare(b.ms, a.ms)) }, skip: 9, limit: 23, batch: 5, order: "meta keys then start"},
		{name: "a meta subfield, then time, then the other subfield", sort: D{{Key: "sensorId.site", Value: -1}, {Key: "ts", Value: 1}, {Key: "sensorId.n", Value: 1}},
			less: func(a, b esEvent) int {
				return cmp.Or(cmp.Compare(b.site, a.site), cmp.Compare(a.ms, b.ms), cmp.Compare(a.n, b.n))
			}, order: "meta keys then start"},
		{name: "a meta subfield then a value", filter: D{{Key: "sensorId.n", Value: int32(2)}}, sort: D{{Key: "sensorId.site", Value: 1}, {Key: "v", Value: -1}, {Key: "_id", Value: 1}},
			match: func(e esEvent) bool { return e.n == 2 },
			less: func(a, b esEvent) int {
				return cmp.Or(cmp.Compare(a.site, b.site), cmp.Compare(b.v, a.v), cmp.Compare(a.id, b.id))
			}, order: "meta keys,"},
		{name: "meta inside $or, by time", filter: D{{Key: "$or", Value: A{D{{Key: "sensorId.site", Value: "north"}}, D{{Key: "v", Value: int32(3)}}}}}, sort: D{{Key: "ts", Value: -1}, {Key: "_id", Value: 1}},
			match: func(e esEvent) bool { return e.site == "north" || e.v == 3 },
			less:  func(a, b esEvent) int { return cmp.Or(cmp.Compare(b.ms, a.ms), cmp.Compare(a.id, b.id)) }, skip: 3, limit: 17, batch: 4, order: "each window's"},
		{name: "$nor with meta, sorted on a value", filter: D{{Key: "$nor", Value: A{D{{Key: "sensorId", Value: D{{Key: "site", Value: "south"}, {Key: "n", Value: int32(1)}}}}}}}, sort: D{{Key: "v", Value: 1}, {Key: "_id", Value: -1}},
			match: func(e esEvent) bool { return e.site != "south" || e.n != 1 },
			less:  func(a, b esEvent) int { return cmp.Or(cmp.Compare(a.v, b.v), cmp.Compare(b.id, a.id)) }, limit: 30, order: "all matching"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := D{{Key: "find", Value: "readings"}}
			if c.filter != nil {
				cmd = append(cmd, E{Key: "filter", Value: c.filter})
			}
			cmd = append(cmd, E{Key: "sort", Value: c.sort})
			for _, o := range []struct {
				k string
				v int64
			}{{"skip", c.skip}, {"limit", c.limit}, {"batchSize", c.batch}} {
				if o.v > 0 {
					cmd = append(cmd, E{Key: o.k, Value: o.v})
				}
			}
			plan, err := rdPlan(t, rwtest.FerretCaps, cmd)
			if err != nil {
				t.Fatal(err)
			}
			if plan.Point == nil || plan.Point.Scan == nil || plan.Point.Spec.Order == nil {
				t.Fatal("not an event scan")
			}
			if got := plan.Point.Scan.OrderExplain(); !strings.Contains(got, c.order) {
				t.Fatalf("order %q, want %q", got, c.order)
			}
			got := drainPoint(t, plan.Point, sb, c.batch)
			var want []int32
			sel := slices.Clone(all)
			if c.match != nil {
				sel = slices.DeleteFunc(sel, func(e esEvent) bool { return !c.match(e) })
			}
			slices.SortStableFunc(sel, c.less)
			for i, e := range sel {
				if int64(i) < c.skip || (c.limit > 0 && int64(len(want)) >= c.limit) {
					continue
				}
				want = append(want, e.id)
			}
			if len(want) == 0 {
				t.Fatal("the case selects nothing")
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got  %v\nwant %v", got, want)
			}
		})
	}
}

// TestEventScanRefusals: what the proxy cannot order or match exactly is
// an error, never a wrong answer.
func TestEventScanRefusals(t *testing.T) {
	find := func(filter, sort D) D {
		cmd := D{{Key: "find", Value: "readings"}, {Key: "sort", Value: sort}}
		if filter != nil {
			cmd = append(cmd, E{Key: "filter", Value: filter})
		}
		return cmd
	}
	t.Run("server orders metas otherwise", func(t *testing.T) {
		sb, _ := eventScanData(t)
		sb.reorder = func(bs []bsoncore.Document) { slices.Reverse(bs) }
		plan, err := rdPlan(t, rwtest.FerretCaps, find(nil, D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		err = feedAll(t, plan.Point, sb)
		if e, ok := err.(*mongoerr.Error); !ok || e.Code != mongoerr.InternalError || !strings.Contains(e.Msg, "out of the order") {
			t.Fatalf("got %v, want an error about the upstream's order", err)
		}
	})
	t.Run("array under a filtered field matches element-wise", func(t *testing.T) {
		sb := &sortedBuckets{all: []bsoncore.Document{rwtest.Doc(t, D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "meta", Value: "a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "count", Value: 1},
			{Key: "events", Value: A{D{{Key: "_id", Value: 1}, {Key: "ts", Value: rwtest.DT(5)}, {Key: "sensorId", Value: nil}, {Key: "v", Value: A{1, 2}}}}}})}}
		plan, err := rdPlan(t, rwtest.FerretCaps, find(D{{Key: "$or", Value: A{D{{Key: "sensorId", Value: "b"}}, D{{Key: "v", Value: 2}}}}}, D{{Key: "ts", Value: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := drainPoint(t, plan.Point, sb, 0); len(got) != 1 || got[0] != 1 {
			t.Fatalf("events %v, want the one whose array holds 2", got)
		}
	})
	t.Run("operator the proxy does not evaluate", func(t *testing.T) {
		_, err := rdPlan(t, rwtest.FerretCaps, find(D{{Key: "v", Value: D{{Key: "$bitsAllSet", Value: D{}}}}}, D{{Key: "sensorId", Value: 1}}))
		if err == nil || !strings.Contains(err.Error(), "sort on the metaField") {
			t.Fatalf("got %v, want the sort's refusal", err)
		}
	})
	t.Run("meta $in is pushed down", func(t *testing.T) {
		plan, err := rdPlan(t, rwtest.FerretCaps, find(D{{Key: "sensorId", Value: D{{Key: "$in", Value: A{"a", "b"}}}}}, D{{Key: "sensorId", Value: -1}, {Key: "ts", Value: -1}}))
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(strings.Fields(rwtest.JSON(plan.Point.ScanFind())), "")
		if !strings.Contains(got, `"filter":{"meta":{"$in":["a","b"]}}`) || !strings.Contains(got, `"sort":{"meta":{"$numberInt":"-1"},"start":{"$numberInt":"-1"}}`) {
			t.Fatalf("find %s", got)
		}
	})
}

// feedAll runs a point read's lookups until it ends or fails.
func feedAll(t *testing.T, pr *point.PointRead, src bucketSource) error {
	for cmds := pr.Lookups(); cmds != nil; cmds = pr.Lookups() {
		var replies [][]byte
		for _, c := range cmds {
			replies = append(replies, src.reply(t, c))
		}
		if err := pr.Feed(replies); err != nil {
			return err
		}
		pr.Want(-1)
		pr.Batch(1)
	}
	return nil
}

// TestEventScanCount: a count whose filter the upstream cannot run on
// unwound events counts the events an event scan yields, with skip and
// limit, and kills the upstream cursor a limit leaves open.
func TestEventScanCount(t *testing.T) {
	sb, all := eventScanData(t)
	or := A{D{{Key: "sensorId.site", Value: "north"}}, D{{Key: "v", Value: D{{Key: "$lt", Value: int32(3)}}}}}
	want := 0
	for _, e := range all {
		if e.site == "north" || e.v < 3 {
			want++
		}
	}
	for _, c := range []struct {
		skip, limit int64
		n           int
		killed      int
	}{{0, 0, want, 0}, {10, 0, want - 10, 0}, {5, 7, 7, 1}} {
		cmd := D{{Key: "count", Value: "readings"}, {Key: "query", Value: D{{Key: "$or", Value: or}}}}
		if c.skip > 0 {
			cmd = append(cmd, E{Key: "skip", Value: c.skip})
		}
		if c.limit > 0 {
			cmd = append(cmd, E{Key: "limit", Value: c.limit})
		}
		sb.killed = 0
		plan, err := rdPlan(t, rwtest.FerretCaps, cmd)
		if err != nil {
			t.Fatal(err)
		}
		p := Plan(rwtest.Doc(t, append(cmd, E{Key: "$db", Value: "iot"})), rwtest.Rule(), Options{Caps: rwtest.FerretCaps}, func() int64 { return 1 })
		if plan.PointDrain == nil {
			t.Fatal("not a counting event scan")
		}
		res := runPlan(t, p, sb)
		if n, _ := res.Lookup("n").AsInt64OK(); int(n) != c.n || sb.killed != c.killed {
			t.Fatalf("skip %d limit %d: %s, %d kills; want n %d, %d kills", c.skip, c.limit, rwtest.JSON(res), sb.killed, c.n, c.killed)
		}
	}
}

// TestPointShapeWhereIDLookupsScan: where a find by _id scans the bucket
// collection, a find the point lookups would serve is one event scan,
// narrowed to its metas and time bounds.
func TestPointShapeWhereIDLookupsScan(t *testing.T) {
	find := D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(2 * rwtest.Hour)}}}}},
		{Key: "sort", Value: D{{Key: "ts", Value: 1}}}, {Key: "$db", Value: "iot"}}
	for _, scan := range []bool{false, true} {
		plan, err := PlanRead(rwtest.Doc(t, find), rwtest.Rule(), Options{Caps: rwtest.FerretCaps, IDLookups: map[bool]IDLookupCost{false: IDLookupIndexed, true: IDLookupScansParsed}[scan]})
		if err != nil {
			t.Fatal(err)
		}
		if plan.Point == nil || (plan.Point.Scan != nil) != scan {
			t.Fatalf("IDLookupsScan %v: scan %v", scan, plan.Point != nil && plan.Point.Scan != nil)
		}
		if scan {
			got := strings.Join(strings.Fields(rwtest.JSON(plan.Point.ScanFind())), "")
			if !strings.Contains(got, `"filter":{"meta":"a",`) || !strings.Contains(got, `"start":{"$gte":{"$date":{"$numberLong":"0"}},"$lt":{"$date":{"$numberLong":"7200000"}}}`) {
				t.Fatalf("find %s", got)
			}
		}
	}
}

// TestEventScanOutlivesRequestBuffer: the proxy reuses a request's buffer
// once the first batch is answered, while the event scan's cursor still
// evaluates the find's filter on every getMore.
func TestEventScanOutlivesRequestBuffer(t *testing.T) {
	sb, all := eventScanData(t)
	body := rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: D{{Key: "$or", Value: A{D{{Key: "sensorId.site", Value: "north"}}, D{{Key: "v", Value: int32(3)}}}}}},
		{Key: "sort", Value: D{{Key: "ts", Value: 1}, {Key: "_id", Value: 1}}}, {Key: "batchSize", Value: 5}, {Key: "$db", Value: "iot"}})
	plan, err := PlanRead(body, rwtest.Rule(), Options{Caps: rwtest.FerretCaps})
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 0xee
	}
	got := drainPoint(t, plan.Point, sb, 5)
	want := 0
	for _, e := range all {
		if e.site == "north" || e.v == 3 {
			want++
		}
	}
	if len(got) != want {
		t.Fatalf("%d events, want %d", len(got), want)
	}
}

// TestPointOrScan: the choice between point lookups and one event scan,
// by what a lookup costs.
func TestPointOrScan(t *testing.T) {
	rng := func(hours int64) E {
		return E{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(hours * rwtest.Hour)}}}
	}
	two := E{Key: "sensorId", Value: D{{Key: "$in", Value: A{"a", "b"}}}}
	one := E{Key: "sensorId", Value: "a"}
	for _, c := range []struct {
		name   string
		filter D
		cost   IDLookupCost
		scan   bool
	}{
		{"indexed", D{one, rng(100)}, IDLookupIndexed, false},
		{"parsed scans: always one scan", D{two, rng(2)}, IDLookupScansParsed, true},
		{"filtered scans, few keys", D{two, rng(2)}, IDLookupScansFiltered, false},
		{"filtered scans, one meta: its equality is filtered too", D{one, rng(2)}, IDLookupScansFiltered, true},
		{"filtered scans, many keys", D{two, rng(maxFilteredLookups)}, IDLookupScansFiltered, true},
		{"filtered scans, one window: its start equality is filtered too", D{two, rng(1)}, IDLookupScansFiltered, true},
	} {
		body := rwtest.Doc(t, D{{Key: "find", Value: "readings"}, {Key: "filter", Value: c.filter}, {Key: "$db", Value: "iot"}})
		plan, err := PlanRead(body, rwtest.Rule(), Options{Caps: rwtest.FerretCaps, IDLookups: c.cost})
		if err != nil {
			t.Fatal(err)
		}
		if plan.Point == nil || (plan.Point.Scan != nil) != c.scan {
			t.Errorf("%s: scan %v, want %v", c.name, plan.Point != nil && plan.Point.Scan != nil, c.scan)
		}
	}
}

// TestEventScanCountDocuments: the pipeline drivers send for
// countDocuments, with the metaField inside $or, is counted by the proxy
// and answered as the server answers it.
func TestEventScanCountDocuments(t *testing.T) {
	sb, all := eventScanData(t)
	match := D{{Key: "$match", Value: D{{Key: "$or", Value: A{D{{Key: "sensorId.site", Value: "north"}}, D{{Key: "v", Value: D{{Key: "$lt", Value: int32(3)}}}}}}}}}
	want := 0
	for _, e := range all {
		if e.site == "north" || e.v < 3 {
			want++
		}
	}
	for _, c := range []struct {
		stages A
		reply  string
	}{
		{A{match, D{{Key: "$group", Value: D{{Key: "_id", Value: 1}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}}, fmt.Sprintf(`"firstBatch": [{"_id": {"$numberInt":"1"},"n": {"$numberInt":"%d"}}]`, want)},
		{A{match, D{{Key: "$skip", Value: int64(10)}}, D{{Key: "$limit", Value: int64(5)}}, D{{Key: "$group", Value: D{{Key: "_id", Value: 1}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}}, `"firstBatch": [{"_id": {"$numberInt":"1"},"n": {"$numberInt":"5"}}]`},
		{A{match, D{{Key: "$count", Value: "total"}}}, fmt.Sprintf(`"firstBatch": [{"total": {"$numberInt":"%d"}}]`, want)},
		{A{match, D{{Key: "$skip", Value: int64(100_000)}}, D{{Key: "$count", Value: "total"}}}, `"firstBatch": []`},
	} {
		cmd := D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: c.stages}, {Key: "cursor", Value: D{}}, {Key: "$db", Value: "iot"}}
		p := Plan(rwtest.Doc(t, cmd), rwtest.Rule(), Options{Caps: rwtest.FerretCaps}, func() int64 { return 1 })
		res := runPlan(t, p, sb)
		if got := rwtest.JSON(res); !strings.Contains(got, c.reply) || !strings.Contains(got, `"ns": "iot.readings"`) {
			t.Errorf("%v:\n got %s\nwant %s", c.stages, got, c.reply)
		}
	}
}

// runPlan runs a plan against src and returns its reply.
func runPlan(t *testing.T, p rewrite.Plan, src bucketSource) bsoncore.Document {
	t.Helper()
	for i := 0; i < 1000; i++ {
		step, done := p.Next()
		if done {
			return p.Result().Reply
		}
		replies := make([][]byte, len(step))
		for j, u := range step {
			replies[j] = src.reply(t, u.Body)
		}
		if err := p.Feed(replies); err != nil {
			t.Fatalf("feed: %v (round %d)", err, i)
		}
	}
	t.Fatal("plan did not end")
	return nil
}

// TestEventScanDistinct: a distinct whose query has the metaField inside
// $or is collected by the proxy from the events.
func TestEventScanDistinct(t *testing.T) {
	sb, all := eventScanData(t)
	cmd := D{{Key: "distinct", Value: "readings"}, {Key: "key", Value: "v"},
		{Key: "query", Value: D{{Key: "$or", Value: A{D{{Key: "sensorId.n", Value: int32(2)}}, D{{Key: "v", Value: int32(0)}}}}}}, {Key: "$db", Value: "iot"}}
	got := rwtest.JSON(runPlan(t, Plan(rwtest.Doc(t, cmd), rwtest.Rule(), Options{Caps: rwtest.FerretCaps}, func() int64 { return 1 }), sb))
	seen := map[int32]bool{}
	for _, e := range all {
		if e.n == 2 || e.v == 0 {
			seen[e.v] = true
		}
	}
	var vals []string
	for v := int32(0); v < 11; v++ {
		if seen[v] {
			vals = append(vals, fmt.Sprintf(`{"$numberInt":"%d"}`, v))
		}
	}
	if want := `{"values": [` + strings.Join(vals, ",") + `],"ok"`; !strings.Contains(got, want) {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

// TestEventScanAggregate: a find-shaped aggregate ($match, $sort, $skip,
// $limit, $project) whose filter the upstream cannot run on unwound
// events is run by the proxy as the same find; other shapes stay refused.
func TestEventScanAggregate(t *testing.T) {
	sb, all := eventScanData(t)
	match := D{{Key: "$match", Value: D{{Key: "$or", Value: A{D{{Key: "sensorId.site", Value: "north"}}, D{{Key: "v", Value: int32(3)}}}}}}}
	sel := slices.DeleteFunc(slices.Clone(all), func(e esEvent) bool { return e.site != "north" && e.v != 3 })
	slices.SortStableFunc(sel, func(a, b esEvent) int { return cmp.Or(cmp.Compare(b.ms, a.ms), cmp.Compare(a.id, b.id)) })
	var want []string
	for _, e := range sel[3:20] {
		want = append(want, fmt.Sprintf(`{"_id": {"$numberInt":"%d"},"v": {"$numberInt":"%d"}}`, e.id, e.v))
	}
	stages := A{match, D{{Key: "$sort", Value: D{{Key: "ts", Value: -1}, {Key: "_id", Value: 1}}}}, D{{Key: "$skip", Value: 3}}, D{{Key: "$limit", Value: 17}}, D{{Key: "$project", Value: D{{Key: "v", Value: 1}}}}}
	cmd := D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: stages}, {Key: "cursor", Value: D{}}, {Key: "$db", Value: "iot"}}
	got := rwtest.JSON(runPlan(t, Plan(rwtest.Doc(t, cmd), rwtest.Rule(), Options{Caps: rwtest.FerretCaps}, func() int64 { return 1 }), sb))
	if !strings.Contains(got, `"firstBatch": [`+strings.Join(want, ",")+`]`) || !strings.Contains(got, `"ns": "iot.readings"`) {
		t.Fatalf("got %s\nwant the batch %s", got, strings.Join(want, ","))
	}
}

// TestEngineAggregate: pipelines the upstream cannot run on unwound events
// ($group, stages after $limit) are run by the proxy's engine over an
// event scan, with the metaField's value in the events.
func TestEngineAggregate(t *testing.T) {
	sb, all := eventScanData(t)
	match := D{{Key: "$match", Value: D{{Key: "$or", Value: A{D{{Key: "sensorId.site", Value: "north"}}, D{{Key: "v", Value: int32(3)}}}}}}}
	sel := slices.DeleteFunc(slices.Clone(all), func(e esEvent) bool { return e.site != "north" && e.v != 3 })
	counts := map[string]int{}
	for _, e := range sel {
		counts[e.site]++
	}
	run := func(stages A) string {
		cmd := D{{Key: "aggregate", Value: "readings"}, {Key: "pipeline", Value: stages}, {Key: "cursor", Value: D{}}, {Key: "$db", Value: "iot"}}
		if _, err := PlanRead(rwtest.Doc(t, cmd), rwtest.Rule(), Options{Caps: rwtest.FerretCaps}); err != nil {
			t.Fatalf("%v: %v", stages, err)
		}
		return rwtest.JSON(runPlan(t, Plan(rwtest.Doc(t, cmd), rwtest.Rule(), Options{Caps: rwtest.FerretCaps}, func() int64 { return 1 }), sb))
	}
	got := run(A{match, D{{Key: "$group", Value: D{{Key: "_id", Value: "$sensorId.site"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}}, D{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}}})
	var want []string
	for _, site := range slices.Sorted(maps.Keys(counts)) {
		want = append(want, fmt.Sprintf(`{"_id": "%s","n": {"$numberInt":"%d"}}`, site, counts[site]))
	}
	if !strings.Contains(got, `"firstBatch": [`+strings.Join(want, ",")+`]`) {
		t.Fatalf("group: got %s\nwant the batch %s", got, strings.Join(want, ","))
	}
	got = run(A{match, D{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}}, D{{Key: "$limit", Value: 2}}, D{{Key: "$sort", Value: D{{Key: "_id", Value: -1}}}}, D{{Key: "$project", Value: D{{Key: "v", Value: 1}}}}})
	slices.SortFunc(sel, func(a, b esEvent) int { return cmp.Compare(a.id, b.id) })
	want = []string{
		fmt.Sprintf(`{"_id": {"$numberInt":"%d"},"v": {"$numberInt":"%d"}}`, sel[1].id, sel[1].v),
		fmt.Sprintf(`{"_id": {"$numberInt":"%d"},"v": {"$numberInt":"%d"}}`, sel[0].id, sel[0].v),
	}
	if !strings.Contains(got, `"firstBatch": [`+strings.Join(want, ",")+`]`) {
		t.Fatalf("sort after limit: got %s\nwant the batch %s", got, strings.Join(want, ","))
	}
	// A $limit with nothing blocking before it stops the scan early.
	got = run(A{match, D{{Key: "$limit", Value: 3}}, D{{Key: "$addFields", Value: D{{Key: "x", Value: 1}}}}, D{{Key: "$project", Value: D{{Key: "x", Value: 1}}}}})
	if n := strings.Count(got, `"x": {"$numberInt":"1"}`); n != 3 {
		t.Fatalf("limit 3 before $addFields: %d documents in %s", n, got)
	}
}
