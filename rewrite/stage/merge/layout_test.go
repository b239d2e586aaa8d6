package merge_test

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// upsert applies the {q: {_id}, u: {$inc, $set, $setOnInsert} or a
// replacement, upsert: true} statements of an update of a layout rule's
// buckets, as the upstream would.
func (m *mem) upsert(coll string, u rewrite.Upstream) []byte {
	stmts, _ := bsoncore.Document(u.Body).Lookup("updates").Array().Values()
	m.maxBucketStmts = max(m.maxBucketStmts, len(stmts))
	for _, sv := range stmts {
		st := sv.Document()
		id := st.Lookup("q", "_id")
		i := slices.IndexFunc(m.colls[coll], func(d bsoncore.Document) bool { return d.Lookup("_id").Equal(id) })
		cur := map[string]any{}
		if i >= 0 {
			cur = asMap(m.colls[coll][i])
		} else {
			cur["_id"] = bson.ObjectID(id.ObjectID())
		}
		ops, _ := st.Lookup("u").Document().Elements()
		if len(ops) > 0 && !strings.HasPrefix(ops[0].Key(), "$") {
			// A replacement.
			if i >= 0 {
				m.colls[coll][i] = st.Lookup("u").Document()
			} else {
				m.colls[coll] = append(m.colls[coll], st.Lookup("u").Document())
			}
			continue
		}
		for _, op := range ops {
			if op.Key() == "$setOnInsert" && i >= 0 {
				continue
			}
			fields, _ := op.Value().Document().Elements()
			for _, f := range fields {
				var v any
				if err := bson.UnmarshalValue(bson.Type(f.Value().Type), f.Value().Data, &v); err != nil {
					m.t.Fatal(err)
				}
				parent, leaf := walk(cur, f.Key())
				switch op.Key() {
				case "$inc":
					old, _ := parent[leaf].(int64)
					parent[leaf] = old + v.(int64)
				case "$set", "$setOnInsert":
					parent[leaf] = v
				case "$unset":
					delete(parent, leaf)
				default:
					m.t.Fatalf("update operator %s", op.Key())
				}
			}
		}
		b, err := bson.Marshal(cur)
		if err != nil {
			m.t.Fatal(err)
		}
		if i >= 0 {
			m.colls[coll][i] = b
		} else {
			m.colls[coll] = append(m.colls[coll], b)
		}
	}
	return doc(bson.D{{Key: "n", Value: len(stmts)}, {Key: "ok", Value: 1.0}})
}

// asMap reads a document into nested maps.
func asMap(d bsoncore.Document) map[string]any {
	out := map[string]any{}
	els, _ := d.Elements()
	for _, e := range els {
		if sub, ok := e.Value().DocumentOK(); ok {
			out[e.Key()] = asMap(sub)
			continue
		}
		var v any
		_ = bson.UnmarshalValue(bson.Type(e.Value().Type), e.Value().Data, &v)
		out[e.Key()] = v
	}
	return out
}

// walk finds (making them) the maps holding a dotted path's last field.
func walk(m map[string]any, path string) (map[string]any, string) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	return m, parts[len(parts)-1]
}

func hitsRule(layoutName string) *rules.Rule {
	r := &rules.Rule{Namespace: "iot.hits", DB: "iot", Collection: "hits", BucketCollection: "hits.buckets",
		TimeField: "ts", MetaField: "page", Layout: layoutName, Span: time.Minute, MaxEvents: 1000, MaxBytes: 1 << 20,
		LayoutOptions: rules.LayoutOptions{Window: time.Minute, Slot: time.Second}}
	if layoutName == rules.LayoutSlots {
		r.LayoutOptions.ValueField = "v"
		r.LayoutOptions.Aggregated = true
	}
	return r
}

// hits are page p's hits at the given seconds after 10:00, with value v.
func hits(p string, v int64, secs ...int) []bson.D {
	var out []bson.D
	for _, s := range secs {
		out = append(out, bson.D{{Key: "page", Value: p}, {Key: "ts", Value: rwtest.DT(36_000_000 + int64(s)*1000)}, {Key: "v", Value: v}})
	}
	return out
}

// hitsCmd is an insert of evs into iot.hits.
func hitsCmd(t *testing.T, evs []bson.D, extra ...bson.E) rewrite.Command {
	cmd := rwtest.SeqCmd(t, evs, extra...)
	els, _ := bsoncore.Document(cmd.Body).Elements()
	b := bsoncore.NewDocumentBuilder().AppendString("insert", "hits")
	for _, e := range els[1:] {
		b.AppendValue(e.Key(), e.Value())
	}
	cmd.Body = b.Build()
	return cmd
}

// stageLayout stages evs into rule as the proxy does, with newID making
// the staged documents' ids and stamp their arrival stamps.
func stageLayout(t *testing.T, m *mem, rule *rules.Rule, evs []bson.D, newID func() bson.ObjectID, stamp func() int64, extra ...bson.E) {
	t.Helper()
	cmd := hitsCmd(t, evs, extra...)
	pi, err := layout.PrepareStaged(cmd, rule, newID)
	if err != nil {
		t.Fatal(err)
	}
	res := m.run(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: newID, Stamp: stamp}))
	if n, _ := bson.Raw(res.Reply).Lookup("n").AsInt64OK(); int(n) != len(evs) {
		t.Fatalf("staged insert: %s", bson.Raw(res.Reply))
	}
}

// layoutBuckets are the stored buckets of the hits rule by page and
// window start (ms).
func layoutBuckets(t *testing.T, m *mem) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, d := range m.colls["hits.buckets"] {
		b := asMap(d)
		out[fmt.Sprint(b["meta"], "@", b["start"].(bson.DateTime))] = b
	}
	return out
}

func counterOf(t *testing.T, b map[string]any) (total int64, slots map[string]int64) {
	t.Helper()
	slots = map[string]int64{}
	for k, v := range b[rules.BucketSlots].(map[string]any) {
		slots[k] = v.(int64)
	}
	return b[rules.BucketTotal].(int64), slots
}

func TestMergeLayoutCounter(t *testing.T) {
	for _, lookups := range []read.IDLookupCost{read.IDLookupIndexed, read.IDLookupScansParsed} {
		t.Run(fmt.Sprintf("lookups %d", lookups), func(t *testing.T) { testMergeLayoutCounter(t, lookups) })
	}
}

func testMergeLayoutCounter(t *testing.T, lookups read.IDLookupCost) {
	rule := hitsRule(rules.LayoutCounter)
	opts := merge.MergeOptions{All: true, RollupStatements: 1, Host: &hooks{oneScanBeats: lookups.OneScanBeats}}
	stageTwo := func(t *testing.T, m *mem) {
		stageLayout(t, m, rule, append(hits("/a", 1, 0, 0, 5), hits("/b", 1, 61)...), bson.NewObjectID, nil)
		stageLayout(t, m, rule, append(hits("/a", 1, 5, 70), hits("/b", 1, 61)...), bson.NewObjectID, nil)
	}
	// check: stageTwo's hits counted k times each.
	check := func(t *testing.T, m *mem, k int64) {
		t.Helper()
		got := layoutBuckets(t, m)
		want := map[string]struct {
			total int64
			slots map[string]int64
		}{
			"/a@" + fmt.Sprint(bson.DateTime(36_000_000)): {4 * k, map[string]int64{"0": 2 * k, "5": 2 * k}},
			"/a@" + fmt.Sprint(bson.DateTime(36_060_000)): {1 * k, map[string]int64{"10": 1 * k}},
			"/b@" + fmt.Sprint(bson.DateTime(36_060_000)): {2 * k, map[string]int64{"1": 2 * k}},
		}
		if len(got) != len(want) {
			t.Fatalf("buckets %v, want %d", slices.Collect(maps.Keys(got)), len(want))
		}
		for key, w := range want {
			b, ok := got[key]
			if !ok {
				t.Fatalf("no bucket %s", key)
			}
			total, slots := counterOf(t, b)
			if total != w.total || !maps.Equal(slots, w.slots) {
				t.Fatalf("bucket %s: total %d slots %v, want %d %v", key, total, slots, w.total, w.slots)
			}
		}
		for n := range m.colls {
			if strings.HasPrefix(n, rules.StagePrefix) && !strings.HasSuffix(n, "_txns") {
				t.Fatalf("staging collection %s left", n)
			}
		}
	}
	cutMerge := func(m *mem, hook func(name, coll string) bool) {
		m.hook = hook
		cut := opts
		cut.RetryHorizon, cut.Now = time.Hour, time.UnixMilli(900_000)
		m.run(merge.NewMerge(rule, cut))
		m.hook = nil
	}
	failing := func(name, coll string) func(string, string) bool {
		return func(n, c string) bool { return n == name && (coll == "" || c == coll) }
	}

	t.Run("counts every staged hit once: new buckets whole, then upserts", func(t *testing.T) {
		m := newMem(t)
		stageTwo(t, m)
		st := mergeRule(t, m, rule, opts)
		check(t, m, 1)
		if st.Events != 7 || st.Buckets != 3 || st.Keys != 3 || st.Collections != 1 || m.maxBucketStmts != 0 {
			t.Fatalf("stats %+v, %d statements in an update; want 3 buckets inserted", st, m.maxBucketStmts)
		}
		stageTwo(t, m)
		mergeRule(t, m, rule, opts)
		check(t, m, 2)
		if m.maxBucketStmts != 1 {
			t.Fatalf("an update carried %d statements, want at most RollupStatements (1)", m.maxBucketStmts)
		}
	})

	// A merge cut anywhere is finished by the next one, which counts
	// nothing twice (the buckets' marks).
	for _, tc := range []struct {
		name  string
		first bool // the buckets exist before (the merge updates them)
		fail  func(string, string) bool
	}{
		{"at its insert of new buckets", false, failing("insert", "hits.buckets")},
		{"at its drop, after inserting", false, failing("drop", "")},
		{"at its update", true, failing("update", "")},
		{"at its drop, after updating", true, failing("drop", "")},
		{"between its upserts", true, func() func(string, string) bool {
			calls := 0
			return func(n, _ string) bool {
				if n == "update" {
					calls++
					return calls > 1
				}
				return false
			}
		}()},
	} {
		t.Run("a merge cut "+tc.name+" is finished once", func(t *testing.T) {
			m := newMem(t)
			k := int64(1)
			if tc.first {
				stageTwo(t, m)
				mergeRule(t, m, rule, opts)
				k = 2
			}
			stageTwo(t, m)
			cutMerge(m, tc.fail)
			mergeRule(t, m, rule, opts)
			check(t, m, k)
			mergeRule(t, m, rule, opts) // nothing left: nothing changes
			check(t, m, k)
		})
	}

	t.Run("a retried insert merged before is not counted again", func(t *testing.T) {
		m := newMem(t)
		stageLayout(t, m, rule, hits("/a", 1, 1, 2), bson.NewObjectID, nil, retryArgs(7)...)
		first := opts
		first.Now = time.UnixMilli(900_000)
		mergeRule(t, m, rule, first)
		stageLayout(t, m, rule, hits("/a", 1, 1, 2), bson.NewObjectID, nil, retryArgs(7)...)
		st := mergeRule(t, m, rule, opts)
		if st.Retries != 1 {
			t.Fatalf("stats %+v, want the retry left out", st)
		}
		total, _ := counterOf(t, layoutBuckets(t, m)["/a@"+fmt.Sprint(bson.DateTime(36_000_000))])
		if total != 2 {
			t.Fatalf("total %d, want 2", total)
		}
	})
}

func TestMergeLayoutSlots(t *testing.T) {
	rule := hitsRule(rules.LayoutSlots)
	opts := merge.MergeOptions{All: true}
	// Staged documents' ids in the reverse of their arrival: the merge
	// goes by the arrival stamps.
	next := byte(200)
	descending := func() bson.ObjectID {
		next--
		var id bson.ObjectID
		id[11] = next
		return id
	}
	var clock int64
	stamp := func() int64 { clock++; return clock }
	stageThree := func(t *testing.T, m *mem) {
		stageLayout(t, m, rule, hits("/a", 1, 0, 1, 2), descending, stamp)
		stageLayout(t, m, rule, hits("/a", 7, 1), descending, stamp)
		stageLayout(t, m, rule, hits("/a", 9, 2, 3), descending, stamp)
	}
	check := func(t *testing.T, m *mem) {
		t.Helper()
		b := layoutBuckets(t, m)["/a@"+fmt.Sprint(bson.DateTime(36_000_000))]
		if b == nil {
			t.Fatalf("no bucket: %v", layoutBuckets(t, m))
		}
		vals := b[rules.BucketValues].(map[string]any)
		want := map[string]int64{"0": 1, "1": 7, "2": 9, "3": 9}
		for k, w := range want {
			if vals[k] != w {
				t.Fatalf("slot %s = %v, want %d (values %v)", k, vals[k], w, vals)
			}
		}
		if b[rules.BucketNumSamples] != int64(4) || b[rules.BucketTotalSamples] != int64(26) {
			t.Fatalf("num_samples %v total_samples %v, want 4 and 26", b[rules.BucketNumSamples], b[rules.BucketTotalSamples])
		}
	}
	t.Run("the last write of a slot wins, by arrival", func(t *testing.T) {
		m := newMem(t)
		stageThree(t, m)
		mergeRule(t, m, rule, opts)
		check(t, m)
	})
	t.Run("a merge cut after its upserts is finished without change", func(t *testing.T) {
		m := newMem(t)
		stageThree(t, m)
		m.fail["drop"] = true
		cut := opts
		cut.RetryHorizon, cut.Now = time.Hour, time.UnixMilli(900_000)
		m.run(merge.NewMerge(rule, cut))
		m.fail["drop"] = false
		check(t, m)
		mergeRule(t, m, rule, opts)
		check(t, m)
	})
	t.Run("a later merge overwrites and keeps the sums", func(t *testing.T) {
		m := newMem(t)
		stageThree(t, m)
		mergeRule(t, m, rule, opts)
		stageLayout(t, m, rule, hits("/a", 2, 0), descending, stamp)
		mergeRule(t, m, rule, opts)
		b := layoutBuckets(t, m)["/a@"+fmt.Sprint(bson.DateTime(36_000_000))]
		if b[rules.BucketNumSamples] != int64(4) || b[rules.BucketTotalSamples] != int64(27) {
			t.Fatalf("num_samples %v total_samples %v, want 4 and 27", b[rules.BucketNumSamples], b[rules.BucketTotalSamples])
		}
	})
	t.Run("an event without the valueField is refused at staging", func(t *testing.T) {
		cmd := hitsCmd(t, []bson.D{{{Key: "page", Value: "/a"}, {Key: "ts", Value: rwtest.DT(36_000_000)}}})
		pi, err := layout.PrepareStaged(cmd, rule, bson.NewObjectID)
		if err != nil {
			t.Fatal(err)
		}
		if len(pi.Rejected()) != 1 || !strings.Contains(pi.Rejected()[0].Msg, `valueField "v"`) {
			t.Fatalf("rejected %+v, want the event refused for its valueField", pi.Rejected())
		}
	})
}

// TestMergeLayoutDirectory: with the proxy's directory (MergeOptions.Known)
// a counter or slots merge reads no bucket it wrote whole itself, nor
// any of a window that has none, and leaves the same buckets as a merge
// that reads them all.
func TestMergeLayoutDirectory(t *testing.T) {
	rounds := [][]bson.D{
		append(hits("/a", 1, 0, 0, 5), hits("/b", 2, 61)...),
		append(hits("/a", 3, 5, 70), hits("/b", 4, 61, 62)...), // over both windows of round 1, and a new one
		append(hits("/a", 5, 1, 130), hits("/c", 6, 2)...),
	}
	for _, tc := range []struct {
		name   string
		layout string
		packed bool
		// reads: finds of the buckets by round with the directory.
		reads []int
	}{
		{"counter, packed (whole buckets)", rules.LayoutCounter, true, []int{0, 0, 0}},
		{"counter, $inc (nothing kept whole)", rules.LayoutCounter, false, []int{0, 1, 1}},
		{"slots, packed", rules.LayoutSlots, true, []int{0, 0, 0}},
		{"slots", rules.LayoutSlots, false, []int{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := hitsRule(tc.layout)
			with, without := newMem(t), newMem(t)
			d := &dir{}
			reads := 0
			with.hook = func(name, coll string) bool {
				if name == "find" && coll == "hits.buckets" {
					reads++
				}
				return false
			}
			opts := func(known *stage.Known) merge.MergeOptions {
				return merge.MergeOptions{All: true, TopUp: true, PackedEvents: tc.packed, Host: &hooks{oneScanBeats: read.IDLookupScansParsed.OneScanBeats}, Known: known}
			}
			for i, evs := range rounds {
				stageLayout(t, with, rule, evs, bson.NewObjectID, nil)
				stageLayout(t, without, rule, evs, bson.NewObjectID, nil)
				reads = 0
				st := mergeRule(t, with, rule, opts(d.known()))
				mergeRule(t, without, rule, opts(nil))
				if reads != tc.reads[i] || st.DirectoryReads != 0 {
					t.Fatalf("round %d: %d finds of the buckets, stats %+v; want %d finds and no read of the keys", i, reads, st, tc.reads[i])
				}
				if st.KnownBuckets+reads == 0 {
					t.Fatalf("round %d: stats %+v, want buckets taken from the directory", i, st)
				}
				a, b := layoutBuckets(t, with), layoutBuckets(t, without)
				for _, m := range []map[string]map[string]any{a, b} {
					for _, bk := range m {
						delete(bk, layout.CounterMerged) // a mark of each merge's own
					}
				}
				if !reflect.DeepEqual(a, b) {
					t.Fatalf("round %d: buckets with the directory\n%v\nwithout\n%v", i, a, b)
				}
			}
			if n := len(layoutBuckets(t, with)); n != 5 {
				t.Fatalf("%d buckets, want 5", n)
			}
		})
	}
}
