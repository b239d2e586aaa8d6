package proxy

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
)

// failBucketInsert fails the first insert into the rule's bucket
// collection, as a lost upstream connection would: the freeze before it
// succeeded, so the staging collection is retired and left unmerged.
type failBucketInsert struct {
	r    exec.Runner
	done bool
}

func (f *failBucketInsert) RunStep(step rewrite.Step) ([][]byte, error) {
	for _, u := range step {
		if coll, _ := bson.Raw(u.Body).Lookup("insert").StringValueOK(); coll == "readings.buckets" && !f.done {
			f.done = true
			return nil, errors.New("injected: upstream connection reset")
		}
	}
	return f.r.RunStep(step)
}

// mergeWith runs a merge of db.readings on s with opts, as the
// background merger (background) or a flush would.
func mergeWith(t *testing.T, s *Server, wrap func(exec.Runner) exec.Runner, opts merge.MergeOptions, background bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up, err := s.opts.Dialer.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	caps, err := s.eng.CapsOn(up)
	if err != nil {
		t.Fatal(err)
	}
	rule := s.opts.Rules.Lookup("db", "readings")
	_, err = s.eng.Tier().RunMerge(wrap(exec.OnConn{Up: up}), up, rule, caps, opts, background)
	return err
}

func sensorEvents(n int) []bson.D {
	day1 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	var docs []bson.D
	for i := 0; i < n; i++ {
		docs = append(docs, bson.D{{Key: "ts", Value: day1.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: i}})
	}
	return docs
}

// TestMergedCountsRetiredFirstPass: the events of a retired
// staging collection left by a merge cut short are merged by the next
// merge's first pass (mergeRetiredOnly before the freeze); they must be
// counted in tsproxy_staging_events_total{state="merged"} (and buckets,
// collections) like any other.
func TestMergedCountsRetiredFirstPass(t *testing.T) {
	s, addr := startWireProxy(t, stagedWireRule, "", nil)
	c := dialWire(t, addr)
	wireInsert(t, c, sensorEvents(3)...)
	if err := mergeWith(t, s, func(r exec.Runner) exec.Runner { return &failBucketInsert{r: r} }, merge.MergeOptions{All: true}, false); err == nil {
		t.Fatal("the merge with a failed bucket insert succeeded")
	}
	if err := mergeWith(t, s, func(r exec.Runner) exec.Runner { return r }, merge.MergeOptions{All: true}, false); err != nil {
		t.Fatal(err)
	}
	if n := wireCount(t, c); n != 3 {
		t.Fatalf("count: %d, want 3", n)
	}
	st := s.eng.Tier().State().Snapshot()["db.readings"]
	t.Logf("figures: %+v", st)
	if st.Merged != 3 || st.Buckets != 1 || st.Collections != 1 {
		t.Fatalf("after every staged event was merged (count 3): staged %d, merged %d, buckets %d, collections %d; want merged 3, buckets 1, collections 1",
			st.Staged, st.Merged, st.Buckets, st.Collections)
	}
}

// TestLagKeptWhileMergeFails: a background merge that froze the
// backlog and then failed leaves every event staged and unmerged; the
// backlog gauges (pending, lag) must not read "caught up".
func TestLagKeptWhileMergeFails(t *testing.T) {
	s, addr := startWireProxy(t, stagedWireRule, "", nil)
	c := dialWire(t, addr)
	wireInsert(t, c, sensorEvents(3)...)
	// A background round that finds the collection not due yet: pending.
	if err := mergeWith(t, s, func(r exec.Runner) exec.Runner { return r }, merge.MergeOptions{Now: time.Now()}, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	before := s.eng.Tier().State().Snapshot()["db.readings"]
	if before.Pending != 1 || before.Oldest.IsZero() || time.Since(before.Oldest) < time.Second {
		t.Fatalf("precondition: pending %d, oldest %v", before.Pending, before.Oldest)
	}
	// The next background round merges it, and fails after the freeze.
	if err := mergeWith(t, s, func(r exec.Runner) exec.Runner { return &failBucketInsert{r: r} }, merge.MergeOptions{All: true, Now: time.Now()}, true); err == nil {
		t.Fatal("the merge with a failed bucket insert succeeded")
	}
	st := s.eng.Tier().State().Snapshot()["db.readings"]
	t.Logf("figures after the failed merge: %+v", st)
	if st.Staged-st.Merged != 3 {
		t.Fatalf("precondition: %d staged, %d merged", st.Staged, st.Merged)
	}
	if st.Pending == 0 && st.PendingEvents == 0 && st.Oldest.IsZero() {
		t.Fatalf("3 events staged and not merged (the merge failed), yet pending collections %d, pending events %d, lag 0 (Oldest zero): the backlog gauges read caught up; before the failed merge the lag was %s",
			st.Pending, st.PendingEvents, time.Since(before.Oldest).Round(time.Millisecond))
	}
}

// manualMetrics installs a manual metric reader as the global meter
// provider (before the proxy's instruments are made) and returns a
// function collecting every exported data point as "name{k=v,...}" ->
// value.
func manualMetrics(t *testing.T) func() map[string]float64 {
	prev := otel.GetMeterProvider()
	reader := sdkmetric.NewManualReader()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() { otel.SetMeterProvider(prev) })
	return func() map[string]float64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		key := func(name string, set attribute.Set) string {
			var parts []string
			for _, kv := range set.ToSlice() {
				parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
			}
			return name + "{" + strings.Join(parts, ",") + "}"
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = float64(p.Value)
					}
				case metricdata.Gauge[int64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = float64(p.Value)
					}
				case metricdata.Gauge[float64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = p.Value
					}
				case metricdata.Sum[float64]:
					for _, p := range d.DataPoints {
						out[key(m.Name, p.Attributes)] = p.Value
					}
				}
			}
		}
		return out
	}
}

// TestCollectionsReadNeverNegative: tsproxy.staging.collections
// {from=read} is a counter (Collections - Kept). A merge that took what
// the proxy kept of a collection and then failed counts Kept (at the
// read) but not Collections (at the end): the counter goes negative.
func TestCollectionsReadNeverNegative(t *testing.T) {
	s, addr := startWireProxy(t, stagedWireRule, "", nil)
	c := dialWire(t, addr)
	wireInsert(t, c, sensorEvents(3)...)
	if err := mergeWith(t, s, func(r exec.Runner) exec.Runner { return &failBucketInsert{r: r} }, merge.MergeOptions{All: true}, false); err == nil {
		t.Fatal("the merge with a failed bucket insert succeeded")
	}
	// This server's figures, which its metrics export (Collections -
	// Kept for from="read"; a process's other servers export theirs).
	st := s.eng.Tier().State().Snapshot()["db.readings"]
	if read := st.Collections - st.Kept; read < 0 || st.Kept != 0 {
		t.Fatalf("after a merge that merged no collection (it failed): collections{from=read} = %d, {from=kept} = %d; want 0 and 0 (a counter is never negative)", read, st.Kept)
	}
}

// TestDroppedCollectionsLeaveNoRuleLabels: a client may create,
// fill and drop time-series collections under any names it invents; the
// per-rule staging metrics (and the state behind them) must not keep a
// series for every namespace that ever existed.
func TestDroppedCollectionsLeaveNoRuleLabels(t *testing.T) {
	collect := manualMetrics(t)
	s, addr := startWireProxy(t, "", "", nil)
	c := dialWire(t, addr)
	const n = 5
	for i := 0; i < n; i++ {
		coll := "m" + strconv.Itoa(i)
		mustOK(t, "create", c.cmd(bson.D{{Key: "create", Value: coll}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "ts"}, {Key: "metaField", Value: "s"}}}, {Key: "$db", Value: "cdb"}}))
		mustOK(t, "insert", c.cmd(bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: bson.A{bson.D{{Key: "ts", Value: time.Now()}, {Key: "s", Value: "a"}}}}, {Key: "$db", Value: "cdb"}}))
		mustOK(t, "drop", c.cmd(bson.D{{Key: "drop", Value: coll}, {Key: "$db", Value: "cdb"}}))
	}
	time.Sleep(500 * time.Millisecond)
	rulesSeen := map[string]bool{}
	for k := range collect() {
		// The rules of this test's database (other tests' servers in
		// this process export theirs).
		if strings.HasPrefix(k, "tsproxy.staging.events{") && strings.Contains(k, "rule=cdb.") {
			rulesSeen[k] = true
		}
	}
	t.Logf("series of tsproxy.staging.events: %v", rulesSeen)
	t.Logf("rules in the proxy's staging figures: %d", len(s.eng.Tier().State().Snapshot()))
	if len(rulesSeen) > 0 || len(s.eng.Tier().State().Snapshot()) > 0 {
		t.Fatalf("after %d time-series collections were created and dropped (none exists), the staging metrics still export %d series (%d rules' figures kept); each new name a client invents adds series forever",
			n, len(rulesSeen), len(s.eng.Tier().State().Snapshot()))
	}
}

const slotsWireRule = `rules:
  - namespace: db.cpu
    timeField: ts
    metaField: host
    layout: slots
    valueField: cpu
    aggregates: [cpu]
    window: hour
    slot: second
    mergeAfter: 1h
`

// TestSlotsBucketsWritten: README: "buckets written
// (tsproxy_staging_buckets_total; mean bucket fill = merged events /
// buckets)". Two merges of one host's events into one hour's window
// make one bucket holding 20 events; the events layout counts a bucket
// once (its top-ups are not "written" again), the slots layout counts
// its rewrite as another bucket, halving the "mean fill".
func TestSlotsBucketsWritten(t *testing.T) {
	s, addr := startWireProxy(t, slotsWireRule, "", nil)
	c := dialWire(t, addr)
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	ins := func(from int) {
		arr := bson.A{}
		for i := from; i < from+10; i++ {
			arr = append(arr, bson.D{{Key: "ts", Value: base.Add(time.Duration(i) * time.Second)}, {Key: "host", Value: "h1"}, {Key: "cpu", Value: float64(i)}})
		}
		mustOK(t, "insert", c.cmd(bson.D{{Key: "insert", Value: "cpu"}, {Key: "documents", Value: arr}, {Key: "$db", Value: "db"}}))
		mustOK(t, "flush", c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}))
	}
	ins(0)
	ins(10)
	r := c.cmd(bson.D{{Key: "count", Value: "cpu"}, {Key: "$db", Value: "db"}})
	t.Logf("count: %s", r)
	st := s.eng.Tier().State().Snapshot()["db.cpu"]
	t.Logf("figures: %+v", st)
	if st.Merged != 20 || st.Buckets != 1 {
		t.Fatalf("20 events of one host in one hour (one bucket): merged %d, buckets written %d, mean fill %.1f; want merged 20, 1 bucket, fill 20",
			st.Merged, st.Buckets, float64(st.Merged)/float64(max(st.Buckets, 1)))
	}
}

// TestEventsBucketsWrittenContrast: the events layout counts a bucket it
// tops up once, as the slots layout now does.
func TestEventsBucketsWrittenContrast(t *testing.T) {
	s, addr := startWireProxy(t, stagedWireRule, "", nil)
	c := dialWire(t, addr)
	ev := sensorEvents(6)
	wireInsert(t, c, ev[:3]...)
	mustOK(t, "flush", c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}))
	wireInsert(t, c, ev[3:]...)
	mustOK(t, "flush", c.cmd(bson.D{{Key: "tsproxyFlush", Value: 1}, {Key: "$db", Value: "admin"}}))
	if st := s.eng.Tier().State().Snapshot()["db.readings"]; st.Merged != 6 || st.Buckets != 1 {
		t.Fatalf("6 events of one series in one hour, merged in two flushes (the second tops the bucket up): %+v, want merged 6, 1 bucket", st)
	}
}
