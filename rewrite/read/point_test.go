package read

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

func TestPointPlan(t *testing.T) {
	rng := func(a, b int64) E {
		return E{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(a)}, {Key: "$lt", Value: rwtest.DT(b)}}}
	}
	meta := func(v any) E { return E{Key: "sensorId", Value: v} }
	cases := []struct {
		name    string
		filter  D
		sort    D
		why     string // fallback reason (substring); "" = point plan
		metas   int
		windows []int64
	}{
		{name: "one series one day", filter: D{meta("a"), rng(0, 24*rwtest.Hour)}, metas: 1, windows: hours(0, 23)},
		{name: "range inside one window", filter: D{meta("a"), rng(rwtest.Hour+5, rwtest.Hour+10)}, metas: 1, windows: []int64{rwtest.Hour}},
		{name: "$lt on a window edge excludes that window", filter: D{meta("a"), rng(rwtest.Hour, 3*rwtest.Hour)}, metas: 1, windows: hours(1, 2)},
		{name: "$lte on a window edge includes it", filter: D{meta("a"), {Key: "ts", Value: D{{Key: "$gt", Value: rwtest.DT(rwtest.Hour)}, {Key: "$lte", Value: rwtest.DT(3 * rwtest.Hour)}}}}, metas: 1, windows: hours(1, 3)},
		{name: "bare date equality", filter: D{meta("a"), {Key: "ts", Value: rwtest.DT(rwtest.Hour + 1)}}, metas: 1, windows: []int64{rwtest.Hour}},
		{name: "$and of bounds", filter: D{{Key: "$and", Value: A{D{meta("a")}, D{{Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}}}}, D{{Key: "ts", Value: D{{Key: "$lt", Value: rwtest.DT(2 * rwtest.Hour)}}}}}}}, metas: 1, windows: hours(0, 1)},
		{name: "$eq meta", filter: D{meta(D{{Key: "$eq", Value: "a"}}), rng(0, rwtest.Hour)}, metas: 1, windows: hours(0, 0)},
		{name: "$in metas deduplicated", filter: D{meta(D{{Key: "$in", Value: A{"a", "b", "a"}}}), rng(0, rwtest.Hour)}, metas: 2, windows: hours(0, 0)},
		{name: "document meta", filter: D{meta(D{{Key: "site", Value: "n"}, {Key: "tags", Value: A{"x"}}}), rng(0, rwtest.Hour)}, metas: 1, windows: hours(0, 0)},
		{name: "null meta", filter: D{meta(nil), rng(0, rwtest.Hour)}, metas: 1, windows: hours(0, 0)},
		{name: "desc sort reverses windows", filter: D{meta("a"), rng(0, 3*rwtest.Hour)}, sort: D{{Key: "ts", Value: -1}}, metas: 1, windows: []int64{2 * rwtest.Hour, rwtest.Hour, 0}},
		{name: "sort ts then _id", filter: D{meta("a"), rng(0, rwtest.Hour)}, sort: D{{Key: "ts", Value: 1}, {Key: "_id", Value: -1}}, metas: 1, windows: hours(0, 0)},
		{name: "before the epoch", filter: D{meta("a"), rng(-rwtest.Hour-1, -rwtest.Hour+1)}, metas: 1, windows: []int64{-2 * rwtest.Hour, -rwtest.Hour}},
		{name: "empty range", filter: D{meta("a"), rng(2*rwtest.Hour, rwtest.Hour)}, metas: 1},
		{name: "from the smallest date", filter: D{meta("a"), rng(math.MinInt64, 2*rwtest.Hour)}, why: "keys"},
		{name: "at the largest date", filter: D{meta("a"), {Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(math.MaxInt64 - 1000)}, {Key: "$lte", Value: rwtest.DT(math.MaxInt64)}}}}, metas: 1, windows: []int64{math.MaxInt64 - math.MaxInt64%rwtest.Hour}},
		{name: "empty $gt $lt same", filter: D{meta("a"), {Key: "ts", Value: D{{Key: "$gt", Value: rwtest.DT(rwtest.Hour)}, {Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}}, metas: 1},

		{name: "no filter", why: "no filter"},
		{name: "meta not fixed", filter: D{rng(0, rwtest.Hour)}, why: "metaField is not fixed"},
		{name: "open-ended", filter: D{meta("a"), {Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}}}}, why: "not bounded"},
		{name: "numeric meta", filter: D{meta(int32(7)), rng(0, rwtest.Hour)}, why: "type int "},
		{name: "double in $in", filter: D{meta(D{{Key: "$in", Value: A{"a", 9.5}}}), rng(0, rwtest.Hour)}, why: "double"},
		{name: "number inside a document meta", filter: D{meta(D{{Key: "n", Value: int32(1)}}), rng(0, rwtest.Hour)}, why: "type object"},
		{name: "regex meta", filter: D{meta(bson.Regex{Pattern: "^a"}), rng(0, rwtest.Hour)}, why: "regex"},
		{name: "array meta", filter: D{meta(A{"a"}), rng(0, rwtest.Hour)}, why: "array"},
		{name: "meta $ne", filter: D{meta(D{{Key: "$ne", Value: "a"}}), rng(0, rwtest.Hour)}, why: "$ne"},
		{name: "dotted meta", filter: D{{Key: "sensorId.site", Value: "n"}, rng(0, rwtest.Hour)}, why: "metaField is not fixed"},
		{name: "two meta conditions", filter: D{{Key: "$and", Value: A{D{meta("a")}, D{meta("b")}}}, rng(0, rwtest.Hour)}, why: "more than one"},
		{name: "a measurement too", filter: D{meta("a"), rng(0, rwtest.Hour), {Key: "v", Value: 1}}, metas: 1, windows: []int64{0}},
		{name: "$or on measurements", filter: D{meta("a"), rng(0, rwtest.Hour), {Key: "$or", Value: A{D{{Key: "v", Value: 1}}}}}, metas: 1, windows: []int64{0}},
		{name: "an operator the proxy cannot apply", filter: D{meta("a"), rng(0, rwtest.Hour), {Key: "v", Value: D{{Key: "$near", Value: A{0, 0}}}}}, why: "$near"},
		{name: "ts $in", filter: D{meta("a"), {Key: "ts", Value: D{{Key: "$in", Value: A{rwtest.DT(0)}}}}}, why: "array"},
		{name: "ts compared to a number", filter: D{meta("a"), {Key: "ts", Value: D{{Key: "$gte", Value: 0}, {Key: "$lt", Value: rwtest.DT(rwtest.Hour)}}}}, why: "$gte with a int"},
		{name: "sort on a field", filter: D{meta("a"), rng(0, rwtest.Hour)}, sort: D{{Key: "v", Value: 1}}, why: `sort on "v"`},
		{name: "sort ts then field", filter: D{meta("a"), rng(0, rwtest.Hour)}, sort: D{{Key: "ts", Value: 1}, {Key: "v", Value: 1}}, why: "more than the timeField"},
		{name: "too many windows", filter: D{meta("a"), rng(0, 30_000*rwtest.Hour)}, why: "keys"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rc := rwtest.Ctx(t, rwtest.FerretCaps)
			var f, s bsoncore.Document
			if c.filter != nil {
				f = rwtest.Doc(t, c.filter)
			}
			if c.sort != nil {
				s = rwtest.Doc(t, c.sort)
			}
			spec, why := point.PlanPoint(rc, f, s)
			if c.why != "" {
				if spec != nil || !strings.Contains(why, c.why) {
					t.Fatalf("got plan %v, why %q; want a fallback because %q", spec, why, c.why)
				}
				return
			}
			if spec == nil {
				t.Fatalf("no point plan: %s", why)
			}
			if len(spec.Metas) != c.metas || fmt.Sprint(spec.Windows) != fmt.Sprint(c.windows) {
				t.Fatalf("metas %d windows %v; want %d %v", len(spec.Metas), spec.Windows, c.metas, c.windows)
			}
		})
	}
}

func hours(a, b int64) []int64 {
	var out []int64
	for h := a; h <= b; h++ {
		out = append(out, h*rwtest.Hour)
	}
	return out
}

// The ids a point read names are the ones the insert path writes.
func TestPointLookupIDs(t *testing.T) {
	rc := rwtest.Ctx(t, rwtest.FerretCaps)
	spec, why := point.PlanPoint(rc, rwtest.Doc(t, D{{Key: "sensorId", Value: D{{Key: "$in", Value: A{"a", nil}}}}, {Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(rwtest.Hour)}, {Key: "$lte", Value: rwtest.DT(2 * rwtest.Hour)}}}}), nil)
	if spec == nil {
		t.Fatal(why)
	}
	pr := point.NewPointRead(rc, spec, nil, 0, 0, false)
	cmds := pr.Lookups()
	if len(cmds) != 4 {
		t.Fatalf("%d lookups, want 4 (2 metas x 2 windows)", len(cmds))
	}
	str := func(s string) bsoncore.Value {
		return bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, s)}
	}
	want := []bson.ObjectID{
		bucket.ID("iot.readings.buckets", str("a"), rwtest.Hour, 0),
		bucket.ID("iot.readings.buckets", bsoncore.Value{}, rwtest.Hour, 0),
		bucket.ID("iot.readings.buckets", str("a"), 2*rwtest.Hour, 0),
		bucket.ID("iot.readings.buckets", bsoncore.Value{}, 2*rwtest.Hour, 0),
	}
	for i, c := range cmds {
		got := bson.ObjectID(bsoncore.Document(c).Lookup("filter", "_id").ObjectID())
		if got != want[i] {
			t.Errorf("lookup %d: %s, want %s", i, got.Hex(), want[i].Hex())
		}
		if !strings.Contains(rwtest.JSON(c), `"find": "readings.buckets"`) || !strings.Contains(rwtest.JSON(c), `"$db": "iot"`) {
			t.Errorf("lookup %d: %s", i, rwtest.JSON(c))
		}
	}
}

// bucketSource answers the upstream commands of a PointRead.
type bucketSource interface {
	reply(t *testing.T, cmd []byte) []byte
}

// fakeBuckets is a bucket collection for the pure tests: the buckets by _id.
type fakeBuckets map[bson.ObjectID][]byte

func (fb fakeBuckets) reply(t *testing.T, cmd []byte) []byte {
	id := bson.ObjectID(bsoncore.Document(cmd).Lookup("filter", "_id").ObjectID())
	batch := A{}
	if b, ok := fb[id]; ok {
		batch = append(batch, bson.Raw(b))
	}
	return rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: batch}, {Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings.buckets"}}}, {Key: "ok", Value: 1.0}})
}

type ptEvent struct {
	meta any // "<none>": no metaField
	ms   int64
	id   int32
}

// TestPointReadResults checks a point read against a brute-force filter
// and sort of the same events: windows with several seqs, events out of
// order inside a bucket, events outside the range, two metas, skip, limit
// and small batches.
func TestPointReadResults(t *testing.T) {
	rule := rwtest.Rule()
	fb := fakeBuckets{}
	var all []ptEvent
	id := int32(0)
	for _, meta := range []any{"a", "b", "<none>"} {
		for w := int64(0); w < 4; w++ {
			for seq := 0; seq < 3; seq++ {
				var evs A
				for i := 0; i < 5; i++ {
					id++
					// out of time order within a bucket, ties across metas
					ms := w*rwtest.Hour + int64((7*i+3*seq)%15)*60_000
					e := ptEvent{meta: meta, ms: ms, id: id}
					all = append(all, e)
					ev := D{{Key: "_id", Value: id}, {Key: "ts", Value: rwtest.DT(ms)}}
					if meta != "<none>" {
						ev = append(ev, E{Key: "sensorId", Value: nil})
					}
					ev = append(ev, E{Key: "v", Value: int32(i)})
					evs = append(evs, ev)
				}
				var mv any = meta
				if meta == "<none>" {
					mv = nil
				}
				raw := rwtest.Doc(t, D{{Key: "meta", Value: mv}, {Key: "start", Value: rwtest.DT(w * rwtest.Hour)}})
				metaVal := bsoncore.Document(raw).Lookup("meta")
				bid := bucket.ID(rule.BucketNamespace(), metaVal, w*rwtest.Hour, seq)
				fb[bid] = rwtest.Doc(t, D{{Key: "_id", Value: bid}, {Key: "meta", Value: mv}, {Key: "start", Value: rwtest.DT(w * rwtest.Hour)}, {Key: "count", Value: 5}, {Key: "events", Value: evs}})
			}
		}
	}
	lo, hi := int64(20*60_000), 3*rwtest.Hour+5*60_000
	cases := []struct {
		name        string
		metas       A
		sortDir     int
		skip, limit int64
		batch       int64
		zeroFirst   bool
	}{
		{name: "unsorted", metas: A{"a"}},
		{name: "asc", metas: A{"a"}, sortDir: 1},
		{name: "desc skip limit", metas: A{"b"}, sortDir: -1, skip: 7, limit: 11, batch: 4},
		{name: "two metas asc batch 3", metas: A{"b", "a"}, sortDir: 1, batch: 3},
		{name: "null meta desc", metas: A{nil}, sortDir: -1, batch: 1000},
		{name: "limit beyond results", metas: A{"a"}, sortDir: 1, limit: 10_000},
		{name: "three metas past the first batch of 101", metas: A{"a", "b", nil}, sortDir: 1},
		{name: "batchSize 0 first", metas: A{"a"}, sortDir: -1, batch: 0, zeroFirst: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			filter := D{{Key: "sensorId", Value: D{{Key: "$in", Value: c.metas}}}, {Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(lo)}, {Key: "$lt", Value: rwtest.DT(hi)}}}}
			cmd := pagedFind(filter, c.sortDir, c.skip, c.limit, c.batch, c.zeroFirst)
			plan, err := rdPlan(t, rwtest.FerretCaps, cmd)
			if err != nil {
				t.Fatal(err)
			}
			if plan.Point == nil {
				t.Fatal("no point plan")
			}
			got := drainPoint(t, plan.Point, fb, c.batch)
			want := expectPoint(all, c.metas, lo, hi, c.sortDir, c.skip, c.limit)
			if c.sortDir == 0 {
				sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got  %v\nwant %v", got, want)
			}
			if c.sortDir == 0 && c.skip == 0 && c.limit == 0 && len(got) == 0 {
				t.Fatal("no results")
			}
		})
	}
	// The latest event of a series reads the head window's buckets
	// (3 seqs, and one lookup past them), not 16 windows' first ones.
	filter := D{{Key: "sensorId", Value: "a"}, {Key: "ts", Value: D{{Key: "$gte", Value: rwtest.DT(0)}, {Key: "$lt", Value: rwtest.DT(4 * rwtest.Hour)}}}}
	plan, err := rdPlan(t, rwtest.FerretCaps, pagedFind(filter, -1, 0, 1, 0, false))
	if err != nil || plan.Point == nil {
		t.Fatalf("no point plan: %v", err)
	}
	got := drainPoint(t, plan.Point, fb, 0)
	if want := expectPoint(all, A{"a"}, 0, 4*rwtest.Hour, -1, 0, 1); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("latest: got %v, want %v", got, want)
	}
	if plan.Point.BucketsRead != 3 || plan.Point.LookupsSent != 4 {
		t.Fatalf("the latest event read %d buckets in %d lookups, want the head window's 3 in 4", plan.Point.BucketsRead, plan.Point.LookupsSent)
	}
}

// drainPoint runs a point read to the end as the proxy does and returns
// the _ids of the events it returned (checking each event's meta).
func drainPoint(t *testing.T, pr *point.PointRead, fb bucketSource, batch int64) []int32 {
	t.Helper()
	var ids []int32
	for round := 0; ; round++ {
		if round > 0 {
			if batch > 0 {
				pr.Want(batch)
			} else {
				pr.Want(-1)
			}
		}
		for cmds := pr.Lookups(); cmds != nil; cmds = pr.Lookups() {
			var replies [][]byte
			for _, c := range cmds {
				replies = append(replies, fb.reply(t, c))
			}
			if err := pr.Feed(replies); err != nil {
				t.Fatal(err)
			}
		}
		reply, more := pr.Batch(42)
		key := "nextBatch"
		if round == 0 {
			key = "firstBatch"
		}
		arr, err := bsoncore.Document(reply).LookupErr("cursor", key)
		if err != nil {
			t.Fatalf("reply %s: %v", rwtest.JSON(reply), err)
		}
		vals, _ := arr.Array().Values()
		if batch > 0 && int64(len(vals)) > batch {
			t.Fatalf("batch of %d, batchSize %d", len(vals), batch)
		}
		for _, v := range vals {
			d := v.Document()
			ids = append(ids, d.Lookup("_id").Int32())
			if m, err := d.LookupErr("sensorId"); err == nil && m.Type != bsoncore.TypeString && m.Type != bsoncore.TypeNull && m.Type != bsoncore.TypeEmbeddedDocument {
				t.Fatalf("event %s: meta not restored", rwtest.JSON(d))
			}
		}
		gotID := bsoncore.Document(reply).Lookup("cursor", "id").Int64()
		if !more {
			if gotID != 0 {
				t.Fatalf("exhausted cursor with id %d", gotID)
			}
			return ids
		}
		if gotID != 42 || round > 1000 {
			t.Fatalf("cursor id %d at round %d", gotID, round)
		}
	}
}

func expectPoint(all []ptEvent, metas A, lo, hi int64, dir int, skip, limit int64) []int32 {
	var sel []ptEvent
	for _, e := range all {
		in := false
		for _, m := range metas {
			if e.meta == m || (m == nil && e.meta == "<none>") {
				in = true
			}
		}
		if in && e.ms >= lo && e.ms < hi {
			sel = append(sel, e)
		}
	}
	if dir != 0 {
		sort.SliceStable(sel, func(i, j int) bool {
			if sel[i].ms != sel[j].ms {
				return (sel[i].ms < sel[j].ms) == (dir > 0)
			}
			return sel[i].id < sel[j].id
		})
	} else {
		// unsorted: compare as sets
		sort.Slice(sel, func(i, j int) bool { return sel[i].id < sel[j].id })
	}
	var ids []int32
	for i, e := range sel {
		if int64(i) < skip {
			continue
		}
		if limit > 0 && int64(len(ids)) >= limit {
			break
		}
		ids = append(ids, e.id)
	}
	return ids
}

func TestKillCursorsReply(t *testing.T) {
	local := rwtest.JSON(cursor.KillCursorsReply(nil, []int64{7}))
	if !strings.Contains(local, `"cursorsKilled": [{"$numberLong":"7"}]`) || !strings.Contains(local, `"ok": {"$numberDouble":"1.0"}`) {
		t.Fatalf("local: %s", local)
	}
	up := rwtest.Doc(t, D{{Key: "cursorsKilled", Value: A{int64(5)}}, {Key: "cursorsNotFound", Value: A{int64(7)}}, {Key: "cursorsAlive", Value: A{}}, {Key: "cursorsUnknown", Value: A{}}, {Key: "ok", Value: 1.0}})
	mixed := rwtest.JSON(cursor.KillCursorsReply(up, []int64{7}))
	if !strings.Contains(mixed, `"cursorsKilled": [{"$numberLong":"5"},{"$numberLong":"7"}]`) || !strings.Contains(mixed, `"cursorsNotFound": []`) {
		t.Fatalf("mixed: %s", mixed)
	}
}

// pagedFind is a find on readings by filter, sorted by time (sortDir 0:
// unsorted) with the given paging; zero skip, limit and batch are left
// out unless zeroFirst asks for batchSize 0.
func pagedFind(filter any, sortDir int, skip, limit, batch int64, zeroFirst bool) D {
	cmd := D{{Key: "find", Value: "readings"}, {Key: "filter", Value: filter}}
	if sortDir != 0 {
		cmd = append(cmd, E{Key: "sort", Value: D{{Key: "ts", Value: sortDir}, {Key: "_id", Value: 1}}})
	}
	if skip > 0 {
		cmd = append(cmd, E{Key: "skip", Value: skip})
	}
	if limit > 0 {
		cmd = append(cmd, E{Key: "limit", Value: limit})
	}
	if batch > 0 || zeroFirst {
		cmd = append(cmd, E{Key: "batchSize", Value: batch})
	}
	return cmd
}
