package merge_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rewrite/stage/merge"
	"github.com/tsproxy/tsproxy/rules"
)

// mem is a database in memory that answers the commands a staged insert
// and a merge send, as FerretDB does, so the plans run to their end
// without a server (the e2e tests run them against real ones).
type mem struct {
	t     *testing.T
	colls map[string][]bsoncore.Document
	fail  map[string]bool // commands answered with an error, by name
	// hook, when set, also says which commands fail (by name and
	// collection).
	hook func(name, coll string) bool
	// lastVersion is the event-id index version checkIDIndex saw last.
	lastVersion int64
	// rolled adds up the counts the rollup upserts $inc, by rollup
	// collection and series.
	rolled map[string]int
	// maxBucketStmts is the most statements one update of the bucket
	// collection carried.
	maxBucketStmts int
	topUpFilters   []bsoncore.Document // the q of every top-up statement
	deletesByID    int                 // delete statements of one entry by its _id
	// uuids are the collections' uuids as listCollections gives them.
	uuids    map[string]int
	nextUUID int
	// lost are collections whose table FerretDB on PostgreSQL lost: any
	// command on them but a rename fails with undefined_table.
	lost map[string]bool
}

func newMem(t *testing.T) *mem {
	return &mem{t: t, colls: map[string][]bsoncore.Document{}, fail: map[string]bool{}, rolled: map[string]int{}, uuids: map[string]int{}, lost: map[string]bool{}}
}

func (m *mem) run(p rewrite.Plan) rewrite.Result {
	m.t.Helper()
	return m.runWith(p, m.answer)
}

// runWith runs p, answering its commands with answer.
func (m *mem) runWith(p rewrite.Plan, answer func(rewrite.Upstream) []byte) rewrite.Result {
	m.t.Helper()
	for i := 0; i < 10_000; i++ {
		step, done := p.Next()
		if done {
			return p.Result()
		}
		replies := make([][]byte, len(step))
		for j, u := range step {
			replies[j] = answer(u)
		}
		if err := p.Feed(replies); err != nil {
			return rewrite.Result{Reply: bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendString("errmsg", err.Error()).Build()}
		}
	}
	m.t.Fatal("plan did not end")
	return rewrite.Result{}
}

func doc(v any) bsoncore.Document {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func (m *mem) answer(u rewrite.Upstream) []byte {
	body := bsoncore.Document(u.Body)
	first, _ := body.IndexErr(0)
	name := first.Key()
	coll, _ := first.Value().StringValueOK()
	if m.fail[name] || m.hook != nil && m.hook(name, coll) {
		return doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 1}, {Key: "errmsg", Value: "injected"}})
	}
	if m.lost[coll] && name != "renameCollection" && name != "listCollections" {
		return doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 1}, {Key: "errmsg", Value: `ERROR: relation "iot.t_0bad" does not exist (SQLSTATE 42P01)`}})
	}
	switch name {
	case "listCollections":
		// With a name filter, each collection's uuid too: a drop and
		// create gives another (m.uuids).
		only, filtered := body.Lookup("filter", "name").StringValueOK()
		names := []any{}
		for n := range m.colls {
			switch {
			case !filtered:
				names = append(names, bson.D{{Key: "name", Value: n}})
			case n == only:
				if m.uuids[n] == 0 {
					m.nextUUID++
					m.uuids[n] = m.nextUUID
				}
				uuid := bson.Binary{Subtype: 4, Data: []byte{15: byte(m.uuids[n])}}
				names = append(names, bson.D{{Key: "name", Value: n}, {Key: "info", Value: bson.D{{Key: "uuid", Value: uuid}}}})
			}
		}
		return doc(bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.$cmd.listCollections"}, {Key: "firstBatch", Value: names}}}, {Key: "ok", Value: 1.0}})
	case "renameCollection":
		from := strings.TrimPrefix(coll, "iot.")
		to, _ := body.Lookup("to").StringValueOK()
		docs, ok := m.colls[from]
		if !ok {
			return doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 26}, {Key: "errmsg", Value: "no source"}})
		}
		if _, taken := m.colls[strings.TrimPrefix(to, "iot.")]; taken {
			return doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 48}, {Key: "errmsg", Value: "target exists"}})
		}
		delete(m.colls, from)
		m.colls[strings.TrimPrefix(to, "iot.")] = docs
		if m.lost[from] {
			delete(m.lost, from)
			m.lost[strings.TrimPrefix(to, "iot.")] = true
		}
	case "count":
		return doc(bson.D{{Key: "n", Value: len(m.colls[coll])}, {Key: "ok", Value: 1.0}})
	case "create":
		if _, ok := m.colls[coll]; ok {
			return doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 48}, {Key: "errmsg", Value: "exists"}})
		}
		m.colls[coll] = []bsoncore.Document{}
	case "drop":
		delete(m.colls, coll)
		delete(m.uuids, coll)
	case "delete":
		// The records' expiry, and stale event-id index entries by _id.
		var dels []bsoncore.Value
		if u.Seq != nil {
			for _, d := range u.Seq.Documents {
				dels = append(dels, bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: d})
			}
		} else {
			dels, _ = body.Lookup("deletes").Array().Values()
		}
		for _, dv := range dels {
			if id, ok := dv.Document().Lookup("q", "_id").StringValueOK(); ok {
				// One entry by its _id.
				m.deletesByID++
				m.colls[coll] = slices.DeleteFunc(m.colls[coll], func(d bsoncore.Document) bool {
					s, _ := d.Lookup("_id").StringValueOK()
					return s == id
				})
				continue
			}
			if cut, ok := dv.Document().Lookup("q", "at", "$lt").DateTimeOK(); ok {
				m.colls[coll] = slices.DeleteFunc(m.colls[coll], func(d bsoncore.Document) bool {
					at, ok := d.Lookup("at").DateTimeOK()
					return ok && at < cut
				})
				continue
			}
			if ne, ok := dv.Document().Lookup("q", "_id", "$ne").StringValueOK(); ok {
				// A spare's: everything but its marker (spare.go).
				m.colls[coll] = slices.DeleteFunc(m.colls[coll], func(d bsoncore.Document) bool {
					s, isStr := d.Lookup("_id").StringValueOK()
					return !isStr || s != ne
				})
				continue
			}
			in, ok := dv.Document().Lookup("q", "_id", "$in").ArrayOK()
			if !ok {
				continue
			}
			ids, _ := in.Values()
			m.colls[coll] = slices.DeleteFunc(m.colls[coll], func(d bsoncore.Document) bool {
				return slices.ContainsFunc(ids, func(v bsoncore.Value) bool { return v.Equal(d.Lookup("_id")) })
			})
		}
	case "insert":
		var errs []any
		for i, d := range u.Seq.Documents {
			id := bsoncore.Document(d).Lookup("_id")
			if slices.ContainsFunc(m.colls[coll], func(e bsoncore.Document) bool { return e.Lookup("_id").Equal(id) }) {
				errs = append(errs, bson.D{{Key: "index", Value: i}, {Key: "code", Value: 11000}, {Key: "errmsg", Value: "E11000 duplicate key"}})
				continue
			}
			m.colls[coll] = append(m.colls[coll], bsoncore.Document(d))
		}
		r := bson.D{{Key: "n", Value: len(u.Seq.Documents) - len(errs)}}
		if errs != nil {
			r = append(r, bson.E{Key: "writeErrors", Value: errs})
		}
		return doc(append(r, bson.E{Key: "ok", Value: 1.0}))
	case "update":
		if strings.Contains(coll, ".rollup_") {
			if m.fail["rollup"] {
				return doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 1}, {Key: "errmsg", Value: "injected"}})
			}
			stmts, _ := body.Lookup("updates").Array().Values()
			for _, st := range stmts {
				d := st.Document()
				meta, _ := d.Lookup("u", "$set", "meta").StringValueOK()
				m.rolled[coll+"|"+meta] += int(d.Lookup("u", "$inc", "count").Int32())
			}
			break
		}
		if coll == "hits.buckets" {
			return m.upsert(coll, u)
		}
		if coll == "readings.buckets" {
			// A top-up: a replacement on {_id} (a first run) or {_id,
			// count} (a repeated merge).
			m.maxBucketStmts = max(m.maxBucketStmts, len(u.Seq.Documents))
			n := 0
			for _, st := range u.Seq.Documents {
				q, repl := bsoncore.Document(st).Lookup("q").Document(), bsoncore.Document(st).Lookup("u").Document()
				m.topUpFilters = append(m.topUpFilters, q)
				for i, d := range m.colls[coll] {
					c, _ := d.Lookup("count").AsInt64OK()
					want, conditional := q.Lookup("count").AsInt64OK()
					if d.Lookup("_id").Equal(q.Lookup("_id")) && (!conditional || c == want) {
						m.colls[coll][i] = repl
						n++
					}
				}
			}
			return doc(bson.D{{Key: "n", Value: n}, {Key: "nModified", Value: n}, {Key: "ok", Value: 1.0}})
		}
		if id, _ := bsoncore.Document(u.Seq.Documents[0]).Lookup("q", "_id").StringValueOK(); strings.HasPrefix(id, "series:") {
			m.upsertSeries(coll, u.Seq.Documents)
			return doc(bson.D{{Key: "n", Value: len(u.Seq.Documents)}, {Key: "ok", Value: 1.0}})
		}
		// Otherwise the id-time documents' and the event-id index
		// marker's version: {$set: {v: n}}.
		for _, st := range u.Seq.Documents {
			id := bsoncore.Document(st).Lookup("q", "_id")
			if s, _ := id.StringValueOK(); strings.HasPrefix(s, "m:") || strings.HasPrefix(s, "s:") {
				m.upsertIDTime(coll, st)
				continue
			}
			v := bsoncore.Document(st).Lookup("u", "$set", "v").Int64()
			for i, d := range m.colls[coll] {
				if d.Lookup("_id").Equal(id) {
					m.colls[coll][i] = bucket.IDIndexMarkerDoc(v)
				}
			}
		}
	case "find":
		out := []any{}
		in, _ := body.Lookup("filter", "_id", "$in").ArrayOK()
		ids, _ := in.Values()
		eq, hasEq := body.Lookup("filter", "_id").StringValueOK()
		oid, hasOID := body.Lookup("filter", "_id").ObjectIDOK()
		for _, d := range m.colls[coll] {
			if in != nil && !slices.ContainsFunc(ids, func(v bsoncore.Value) bool { return v.Equal(d.Lookup("_id")) }) {
				continue
			}
			if id, _ := d.Lookup("_id").ObjectIDOK(); hasOID && id != oid {
				continue
			}
			if s, _ := d.Lookup("_id").StringValueOK(); hasEq && s != eq {
				continue
			}
			out = append(out, bson.Raw(d))
		}
		return doc(bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot." + coll}, {Key: "firstBatch", Value: out}}}, {Key: "ok", Value: 1.0}})
	default:
		m.t.Fatalf("unexpected command %s", name)
	}
	return doc(bson.D{{Key: "ok", Value: 1.0}})
}

// retryArgs are the fields of a retryable write: a session (all zero)
// and txnNumber txn.
func retryArgs(txn int64) []bson.E {
	return []bson.E{{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}}, {Key: "txnNumber", Value: txn}}
}

// events are n events of sensor s, one per second from 10:00.
func events(s string, from, n int) []bson.D {
	var out []bson.D
	for i := from; i < from+n; i++ {
		out = append(out, rwtest.Event(rwtest.OID(byte(i)), rwtest.DT(36_000_000+int64(i)*1000), s, float64(i)))
	}
	return out
}

// dayEvents are n events of sensor s, one per second from 10:00 on day
// day (of 1970: the first staging period is day 0).
func dayEvents(s string, day, n int) []bson.D {
	var out []bson.D
	for i := range n {
		ms := int64(day)*int64(24*time.Hour/time.Millisecond) + 36_000_000 + int64(i)*1000
		out = append(out, rwtest.Event(rwtest.OID(byte(100+day*10+i)), rwtest.DT(ms), s, float64(i)))
	}
	return out
}

func stagedInsert(t *testing.T, m *mem, evs []bson.D, extra ...bson.E) bson.Raw {
	t.Helper()
	return bson.Raw(stagedInsertResult(t, m, evs, extra...).Reply)
}

func stagedInsertResult(t *testing.T, m *mem, evs []bson.D, extra ...bson.E) rewrite.Result {
	t.Helper()
	return stagedInsertWith(t, m, evs, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID}, extra...)
}

// stagedInsertWith runs a staged insert of evs into rwtest.InsertRule
// with env.
func stagedInsertWith(t *testing.T, m *mem, evs []bson.D, env stage.InsertEnv, extra ...bson.E) rewrite.Result {
	t.Helper()
	cmd := rwtest.SeqCmd(t, evs, extra...)
	pi, err := insert.Prepare(cmd, rwtest.InsertRule(), bson.NewObjectID)
	if err != nil {
		t.Fatal(err)
	}
	return m.run(stage.Insert(cmd, pi, env))
}

func TestParse(t *testing.T) {
	rule := rwtest.InsertRule()
	open := rule.StageCollection(36_000_000)
	cases := []struct {
		name string
		want stage.Collection
		ok   bool
	}{
		{open, stage.Collection{Name: open, Window: 0}, true},
		{stage.RetiredName(open, 7), stage.Collection{Name: stage.RetiredName(open, 7), Window: 0, Token: 7}, true},
		{stage.TxnsCollection(rule), stage.Collection{}, false},
		{rule.BucketCollection, stage.Collection{}, false},
		{open + "_m0", stage.Collection{}, false},
		{open + "_mx", stage.Collection{}, false},
		{rule.StagePrefix() + "007", stage.Collection{}, false},
	}
	for _, c := range cases {
		got, ok := stage.Parse(rule, c.name)
		if ok != c.ok || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if strings.Contains(open, ".") {
		t.Errorf("staging name %q has a dot (FerretDB cannot rename it)", open)
	}
}

// listReply is a listCollections reply naming ns, with cursor id id.
func listReply(t *testing.T, id int64, ns ...string) []byte {
	var docs []bson.D
	for _, n := range ns {
		docs = append(docs, bson.D{{Key: "name", Value: n}, {Key: "type", Value: "collection"}})
	}
	return rwtest.CursorReply(t, id, docs...)
}

func TestWorkThrough(t *testing.T) {
	rule := rwtest.InsertRule()
	day := rule.StagePeriod().Milliseconds()
	yesterday, today := 20*day, 21*day
	mine := stage.OpenCollection(rule, today, stage.Stager{Tag: "0a1b2c3d", Gen: 5})
	late := rule.StageCollection(yesterday + 3_600_000) // the holder's, of a late event
	names := func(id int64, ns ...string) []byte { return listReply(t, id, ns...) }
	cases := []struct {
		name    string
		reply   []byte
		through int64
		want    bool
	}{
		{"nothing staged", names(0, rule.BucketCollection, stage.TxnsCollection(rule)), today, false},
		{"today's, a read of yesterday", names(0, mine), today - 1, false},
		{"today's, a read up to its first instant", names(0, mine), today, true},
		{"today's, retired", names(0, stage.RetiredName(mine, 3)), today - 1, false},
		{"today's retired, a read of today", names(0, stage.RetiredName(mine, 3)), today + 5, true},
		{"yesterday's late event", names(0, mine, late), today - 1, true},
		{"a flush request only", names(0, stage.FlushMarker(rule, "ab")), today, false},
		{"more than one batch", names(7, mine), yesterday, true},
	}
	for _, c := range cases {
		got, err := stage.WorkThrough(rule, c.reply, c.through)
		if err != nil || got != c.want {
			t.Errorf("%s: WorkThrough = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

func TestOwnOpenOnly(t *testing.T) {
	rule := rwtest.InsertRule()
	const tag, since = "0a1b2c3d", int64(100)
	mine := stage.OpenCollection(rule, 36_000_000, stage.Stager{Tag: tag, Gen: since})
	mineNext := stage.OpenCollection(rule, 39_600_000, stage.Stager{Tag: tag, Gen: since + 2})
	names := func(id int64, ns ...string) []byte { return listReply(t, id, ns...) }
	cases := []struct {
		name  string
		reply []byte
		own   []string
		ok    bool
	}{
		{"nothing staged", names(0, rule.BucketCollection, stage.TxnsCollection(rule), "other"), nil, true},
		{"two of its own", names(0, rule.BucketCollection, mine, "other", mineNext), []string{mine, mineNext}, true},
		{"its own of a previous run", names(0, mine, stage.OpenCollection(rule, 36_000_000, stage.Stager{Tag: tag, Gen: since - 1})), nil, false},
		{"another proxy's", names(0, mine, stage.OpenCollection(rule, 36_000_000, stage.Stager{Tag: "ffffffff", Gen: since})), nil, false},
		{"the holder's", names(0, mine, rule.StageCollection(36_000_000)), nil, false},
		{"its own retired", names(0, mine, stage.RetiredName(mineNext, 3)), nil, false},
		{"a flush request", names(0, mine, stage.FlushMarker(rule, "ab")), nil, false},
		{"more than one batch", names(42, mine), nil, false},
	}
	for _, c := range cases {
		own, ok, err := stage.OwnOpenOnly(rule, c.reply, tag, since)
		var got []string
		for _, o := range own {
			got = append(got, o.Name)
		}
		if err != nil || ok != c.ok || !slices.Equal(got, c.own) {
			t.Errorf("%s: OwnOpenOnly = %v, %v, %v; want %v, %v", c.name, got, ok, err, c.own, c.ok)
		}
	}
	if _, ok, _ := stage.OwnOpenOnly(rule, names(0, mine), "", since); ok {
		t.Error("OwnOpenOnly with no tag (a proxy staging under the holder's names): ok")
	}
	if _, _, err := stage.OwnOpenOnly(rule, rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: 13}}), tag, since); err == nil {
		t.Error("OwnOpenOnly of an error reply: no error")
	}
}

func TestHasWork(t *testing.T) {
	rule := rwtest.InsertRule()
	open := rule.StageCollection(36_000_000)
	names := func(id int64, ns ...string) []byte { return listReply(t, id, ns...) }
	cases := []struct {
		name  string
		reply []byte
		want  bool
	}{
		{"nothing staged", names(0, rule.BucketCollection, stage.TxnsCollection(rule), "other"), false},
		{"a staging collection", names(0, rule.BucketCollection, open), true},
		{"a retired one", names(0, stage.RetiredName(open, 3)), true},
		{"a flush request", names(0, stage.FlushMarker(rule, "ab")), true},
		{"a retired one set aside, its table lost", names(0, stage.LostName(rule, stage.RetiredName(open, 3))), false},
		{"more than one batch", names(42, "other"), true},
	}
	for _, c := range cases {
		got, err := stage.HasWork(rule, c.reply)
		if err != nil || got != c.want {
			t.Errorf("%s: HasWork = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := stage.HasWork(rule, rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: 13}})); err == nil {
		t.Error("HasWork of an error reply: no error")
	}
}

func TestDerivedID(t *testing.T) {
	key, ok, err := rewrite.RetryKeyOf(doc(bson.D(retryArgs(3))))
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	a := stage.DerivedID(key.OwnedBy("alice"), 0)
	if a != stage.DerivedID(key.OwnedBy("alice"), 0) || !stage.IsDerived(a) {
		t.Fatal("not stable or not marked")
	}
	for _, other := range []bson.ObjectID{stage.DerivedID(key.OwnedBy("bob"), 0), stage.DerivedID(key.OwnedBy("alice"), 1)} {
		if other == a {
			t.Fatal("another user or part got the same id")
		}
	}
	if stage.IsDerived(bson.NewObjectID()) {
		t.Fatal("a random ObjectID is taken for a derived one")
	}
}

func TestInsertReplies(t *testing.T) {
	retryable := retryArgs(1)
	t.Run("stores groups as staged buckets", func(t *testing.T) {
		m := newMem(t)
		r := stagedInsert(t, m, append(events("a", 0, 4), events("b", 0, 1)...))
		if n := r.Lookup("n").Int32(); n != 5 {
			t.Fatalf("reply %s, want n: 5", r)
		}
		staged := m.colls[rwtest.InsertRule().StageCollection(36_000_000)]
		// One document: the chunks a: 3 + 1 (maxEvents 3) and b: 1.
		if len(staged) != 1 {
			t.Fatalf("%d staged documents, want 1", len(staged))
		}
		rule := rwtest.InsertRule()
		lim, _ := bucket.LimitsOf(rule)
		evs, err := bucket.StagedEvents(staged[0], rule, lim)
		if err != nil || len(evs) != 5 {
			t.Fatalf("%d staged events (%v), want 5", len(evs), err)
		}
	})
	t.Run("stores the form it is given", func(t *testing.T) {
		rule := rwtest.InsertRule()
		lim, _ := bucket.LimitsOf(rule)
		for _, format := range []bucket.StagedFormat{0, bucket.StagedKeyed, bucket.StagedPacked} {
			m := newMem(t)
			stagedInsertWith(t, m, append(events("a", 0, 4), events("b", 0, 1)...),
				stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Format: format})
			staged := m.colls[rule.StageCollection(36_000_000)]
			if len(staged) != 1 {
				t.Fatalf("form %d: %d staged documents, want 1", format, len(staged))
			}
			_, keyed := staged[0].Lookup(bucket.FieldMeta).StringValueOK()
			if keyed != (format != bucket.StagedPacked) {
				t.Errorf("form %d: staged %s", format, staged[0])
			}
			if evs, err := bucket.StagedEvents(staged[0], rule, lim); err != nil || len(evs) != 5 {
				t.Fatalf("form %d: %d staged events (%v), want 5", format, len(evs), err)
			}
		}
	})
	t.Run("a retry meets its derived ids", func(t *testing.T) {
		m := newMem(t)
		evs := events("a", 0, 4)
		if res := stagedInsertResult(t, m, evs, retryable...); res.StoredBefore != 0 {
			t.Fatalf("first attempt: %d events stored before, want 0", res.StoredBefore)
		}
		res := stagedInsertResult(t, m, evs, retryable...)
		r := bson.Raw(res.Reply)
		if n := r.Lookup("n").Int32(); n != 4 || r.Lookup("writeErrors").Type != 0 || res.StoredBefore != 4 {
			t.Fatalf("retry reply %s (%d stored before), want n: 4, no write errors, 4 stored before", r, res.StoredBefore)
		}
		if got := len(m.colls[rwtest.InsertRule().StageCollection(36_000_000)]); got != 1 {
			t.Fatalf("%d staged documents after the retry, want 1", got)
		}
	})
	t.Run("command error maps to every event", func(t *testing.T) {
		m := newMem(t)
		m.fail["insert"] = true
		r := stagedInsert(t, m, events("a", 0, 2))
		errs, _ := r.Lookup("writeErrors").Array().Values()
		if n := r.Lookup("n").Int32(); n != 0 || len(errs) != 2 {
			t.Fatalf("reply %s, want n: 0 and 2 write errors", r)
		}
	})
	t.Run("one command per staging collection, in order of first appearance", func(t *testing.T) {
		// Days 0, 1, 0, 2: three staging periods (a day each).
		evs := append(events("a", 0, 1), dayEvents("b", 1, 1)...)
		evs = append(evs, events("a", 1, 1)...)
		evs = append(evs, dayEvents("c", 2, 1)...)
		rule := rwtest.InsertRule()
		day := int64(24 * time.Hour / time.Millisecond)
		want := []string{rule.StageCollection(36_000_000), rule.StageCollection(36_000_000 + day), rule.StageCollection(36_000_000 + 2*day)}
		for _, ordered := range []bool{false, true} {
			m := newMem(t)
			var sent []string
			m.hook = func(name, coll string) bool {
				if name == "insert" {
					sent = append(sent, coll)
				}
				return name == "insert" && coll == want[1]
			}
			r := stagedInsert(t, m, evs, bson.E{Key: "ordered", Value: ordered})
			errs, _ := r.Lookup("writeErrors").Array().Values()
			wantSent, wantN := want, int32(3)
			if ordered {
				// An ordered insert stops after the failed command.
				wantSent, wantN = want[:2], 2
			}
			if !slices.Equal(sent, wantSent) || r.Lookup("n").Int32() != wantN || len(errs) != 1 {
				t.Fatalf("ordered %v: sent %v, reply %s; want sent %v, n: %d and 1 write error", ordered, sent, r, wantSent, wantN)
			}
			if idx := errs[0].Document().Lookup("index").Int32(); idx != 1 {
				t.Fatalf("ordered %v: the write error is event %d's, want event 1's", ordered, idx)
			}
		}
	})
	t.Run("a retry key the caller read gives the ids the body gives", func(t *testing.T) {
		rule := rwtest.InsertRule()
		cmd := rwtest.SeqCmd(t, events("a", 0, 2), retryable...)
		key, ok, err := rewrite.RetryKeyOf(cmd.Body)
		if err != nil || !ok {
			t.Fatalf("RetryKeyOf: %v, %v", ok, err)
		}
		var ids [2]bsoncore.Value
		for i, retry := range []*rewrite.ReadRetryKey{nil, {Key: key, Retryable: true}} {
			m := newMem(t)
			pi, err := insert.Prepare(cmd, rule, bson.NewObjectID)
			if err != nil {
				t.Fatal(err)
			}
			m.run(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Retry: retry}))
			staged := m.colls[rule.StageCollection(36_000_000)]
			if len(staged) != 1 {
				t.Fatalf("%d staged documents, want 1", len(staged))
			}
			ids[i] = staged[0].Lookup("_id")
		}
		if !ids[0].Equal(ids[1]) || !stage.IsDerived(ids[0].ObjectID()) {
			t.Fatalf("staged _ids %s and %s: want the same derived id", ids[0], ids[1])
		}
	})
	t.Run("bad events are refused before staging", func(t *testing.T) {
		m := newMem(t)
		evs := events("a", 0, 2)
		evs[1] = rwtest.Event(rwtest.OID(9), "not a date", "a", 1.0)
		r := stagedInsert(t, m, evs)
		errs, _ := r.Lookup("writeErrors").Array().Values()
		if n := r.Lookup("n").Int32(); n != 1 || len(errs) != 1 {
			t.Fatalf("reply %s, want n: 1 and one write error", r)
		}
	})
}

func runMerge(t *testing.T, m *mem, opts merge.MergeOptions) merge.Stats {
	t.Helper()
	return mergeRule(t, m, rwtest.InsertRule(), opts)
}

// announce writes the announcement of the proxy tagged tag staging rule,
// lapsed or not at the merges' time (mergeRule's default Now).
func announce(m *mem, rule *rules.Rule, tag string, live bool) {
	expires := time.UnixMilli(1_000_000).Add(time.Hour)
	if !live {
		expires = time.UnixMilli(1_000_000).Add(-merge.PresenceSkew - time.Second)
	}
	id := stage.PresenceID(rule.BucketCollection, tag)
	docs := slices.DeleteFunc(m.colls[rules.LeaseCollection], func(d bsoncore.Document) bool {
		s, _ := d.Lookup("_id").StringValueOK()
		return s == id
	})
	m.colls[rules.LeaseCollection] = append(docs, doc(bson.D{{Key: "_id", Value: id}, {Key: "ns", Value: stage.PresenceNS(rule.BucketCollection)}, {Key: "owner", Value: tag}, {Key: "expires", Value: expires}}))
}

// mergeRule runs a merge of rule's staging tier that must succeed.
func mergeRule(t *testing.T, m *mem, rule *rules.Rule, opts merge.MergeOptions) merge.Stats {
	t.Helper()
	if opts.Now.IsZero() {
		opts.Now = time.UnixMilli(1_000_000)
	}
	opts.RetryHorizon = time.Hour
	mp := merge.NewMerge(rule, opts)
	res := m.run(mp)
	if ok, _ := bson.Raw(res.Reply).Lookup("ok").AsFloat64OK(); ok != 1 {
		t.Fatalf("merge: %s", bson.Raw(res.Reply))
	}
	return mp.Stats
}

// storedEvents counts the events in the bucket collection by _id.
// storedOnce checks that the buckets hold want events, each once.
// stagedFormName names the forms of staged documents in test names.
var stagedFormName = map[bucket.StagedFormat]string{bucket.StagedKeyed: "keyed", bucket.StagedPacked: "packed"}

// lateDoc is a staged document of form holding one event of series "a"
// at 10:01:39 (window 10:00): another proxy's insert, staged as every
// proxy stages, that lands in a retired collection after its merge read
// it.
func lateDoc(t *testing.T, form bucket.StagedFormat) bsoncore.Document {
	t.Helper()
	other := newMem(t)
	ev := rwtest.Event(rwtest.OID(99), rwtest.DT(36_099_000), "a", 9.0)
	stagedInsertWith(t, other, []bson.D{ev}, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Format: form})
	for name, docs := range other.colls {
		if _, ok := stage.Parse(rwtest.InsertRule(), name); ok && len(docs) == 1 {
			return docs[0]
		}
	}
	t.Fatalf("no staged document in %v", names(other))
	return nil
}

func storedOnce(t *testing.T, m *mem, want int) {
	t.Helper()
	got := storedEvents(t, m)
	if len(got) != want {
		t.Fatalf("%d events stored, want %d", len(got), want)
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("event %s stored %d times", id, n)
		}
	}
}

func storedEvents(t *testing.T, m *mem) map[string]int {
	got := map[string]int{}
	for _, b := range m.colls["readings.buckets"] {
		arr, _ := b.Lookup("events").ArrayOK()
		vals, _ := arr.Values()
		if c, _ := b.Lookup("count").AsInt64OK(); int(c) != len(vals) {
			t.Fatalf("bucket count %d but %d events", c, len(vals))
		}
		for _, v := range vals {
			got[fmt.Sprint(v.Document().Lookup("_id"))]++
		}
	}
	return got
}

// checkIDIndex checks the event-id index of m's rule: each merged bucket
// has an entry that may hold each of its events' ids, and the marker is
// there when wantMarker.
func checkIDIndex(t *testing.T, m *mem, wantMarker bool) {
	t.Helper()
	index := m.colls[rwtest.Rule().IDIndexCollection()]
	i := slices.IndexFunc(index, bucket.IsIDIndexMarker)
	if (i >= 0) != wantMarker {
		t.Fatalf("index marker: %v, want %v", i >= 0, wantMarker)
	}
	if i >= 0 && bucket.IDIndexVersionOf(index[i]) == m.lastVersion {
		t.Fatal("the merge left the index version as it was")
	}
	if i >= 0 {
		m.lastVersion = bucket.IDIndexVersionOf(index[i])
	}
	for _, b := range m.colls["readings.buckets"] {
		bid := b.Lookup("_id").ObjectID()
		vals, _ := b.Lookup("events").Array().Values()
		for _, v := range vals {
			set := bucket.NewIDSet([]bsoncore.Value{v.Document().Lookup("_id")})
			if !slices.ContainsFunc(index, func(e bsoncore.Document) bool {
				id, may, ok := set.MayHold(e)
				return ok && may && id == bid
			}) {
				t.Fatalf("event %s of bucket %s: no index entry may hold it", v.Document().Lookup("_id"), bson.ObjectID(bid).Hex())
			}
		}
	}
}

func TestMerge(t *testing.T) {
	t.Run("merges into full buckets after existing ones and drops staging", func(t *testing.T) {
		m := newMem(t)
		for i := 0; i < 7; i++ {
			stagedInsert(t, m, events("a", i, 1))
		}
		st := runMerge(t, m, merge.MergeOptions{All: true})
		if st.Events != 7 || st.Buckets != 3 || st.Collections != 1 {
			t.Fatalf("stats %+v, want 7 events in 3 buckets from 1 collection", st)
		}
		stagedInsert(t, m, events("a", 7, 1))
		st = runMerge(t, m, merge.MergeOptions{All: true})
		if st.Buckets != 1 {
			t.Fatalf("second merge %+v, want 1 bucket", st)
		}
		// The new bucket is seq 3 of the key: reads find 0..3.
		if !slices.ContainsFunc(m.colls["readings.buckets"], func(d bsoncore.Document) bool {
			id, _ := d.Lookup("_id").ObjectIDOK()
			return id == rwtest.BucketID(t, "a", 36_000_000, 3)
		}) {
			t.Fatal("the second merge did not write seq 3")
		}
		for n := range m.colls {
			if strings.HasPrefix(n, "tsproxy_stage_") && !strings.HasSuffix(n, "_txns") && !strings.HasSuffix(n, "_ids") {
				t.Fatalf("staging collection %s left", n)
			}
		}
		for id, n := range storedEvents(t, m) {
			if n != 1 {
				t.Fatalf("event %s stored %d times", id, n)
			}
		}
		checkIDIndex(t, m, true)
	})
	t.Run("counts the series of a staging collection apart from its windows", func(t *testing.T) {
		// Series sizes the next merge batch (proxy mergeBatch): 2 series
		// over 3 hours of one day's staging collection are 6 keys and
		// 2 series.
		m := newMem(t)
		var evs []bson.D
		for h := range int64(3) {
			for _, s := range []string{"a", "b"} {
				evs = append(evs, rwtest.Event(bson.NewObjectID(), rwtest.DT(36_000_000+h*3_600_000), s, 1))
			}
		}
		stagedInsert(t, m, evs)
		st := runMerge(t, m, merge.MergeOptions{All: true})
		if st.Collections != 1 || st.Keys != 6 || st.Series != 2 {
			t.Fatalf("stats %+v, want 1 collection, 6 keys, 2 series", st)
		}
	})
	t.Run("an event-id index started on buckets it does not cover has no marker", func(t *testing.T) {
		m := newMem(t)
		m.colls["readings.buckets"] = append(m.colls["readings.buckets"], rwtest.Doc(t, bson.D{{Key: "_id", Value: rwtest.OID(9)}, {Key: "meta", Value: "z"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "count", Value: 0}, {Key: "events", Value: bson.A{}}}))
		stagedInsert(t, m, events("a", 0, 1))
		runMerge(t, m, merge.MergeOptions{All: true})
		checkIDIndex(t, m, false)
	})
	t.Run("a merge cut after its plan is finished by the next", func(t *testing.T) {
		m := newMem(t)
		for i := 0; i < 5; i++ {
			stagedInsert(t, m, events("a", i, 1))
		}
		m.fail["drop"] = true
		mp := merge.NewMerge(rwtest.InsertRule(), merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_000), RetryHorizon: time.Hour})
		m.run(mp) // fails at the drop: buckets written, retired collection left
		m.fail["drop"] = false
		st := runMerge(t, m, merge.MergeOptions{})
		if st.Collections != 1 {
			t.Fatalf("resume %+v, want the retired collection merged", st)
		}
		got := storedEvents(t, m)
		if len(got) != 5 {
			t.Fatalf("%d events stored, want 5", len(got))
		}
		for id, n := range got {
			if n != 1 {
				t.Fatalf("event %s stored %d times after the resumed merge", id, n)
			}
		}
	})
	t.Run("a retry merged earlier is left out", func(t *testing.T) {
		m := newMem(t)
		retry := retryArgs(5)
		stagedInsert(t, m, events("a", 0, 2), retry...)
		runMerge(t, m, merge.MergeOptions{All: true})
		stagedInsert(t, m, events("a", 0, 2), retry...) // the late retry lands in a new staging collection
		st := runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_500)})
		if st.Retries != 1 || st.Events != 0 {
			t.Fatalf("stats %+v, want the retry left out", st)
		}
		if got := storedEvents(t, m); len(got) != 2 {
			t.Fatalf("%d events stored, want 2", len(got))
		}
	})
	t.Run("records: packed, read in either form, expired only when past the horizon", func(t *testing.T) {
		m := newMem(t)
		txns := stage.TxnsCollection(rwtest.InsertRule())
		deletes := 0
		m.hook = func(name, coll string) bool {
			if name == "delete" && coll == txns {
				deletes++
			}
			return false
		}
		stagedInsert(t, m, events("a", 0, 2), retryArgs(7)...)
		runMerge(t, m, merge.MergeOptions{All: true})
		if len(m.colls[txns]) != 1 || bson.Raw(m.colls[txns][0]).Lookup("packed").Type != bson.TypeBinary {
			t.Fatalf("records %v, want one with its ids packed", m.colls[txns])
		}
		// A record of a proxy before packing: its ids as an array.
		key, _, _ := rewrite.RetryKeyOf(doc(bson.D(retryArgs(8))))
		m.colls[txns] = append(m.colls[txns], doc(bson.D{{Key: "_id", Value: int64(5)}, {Key: "ids", Value: bson.A{stage.DerivedID(key.OwnedBy("u"), 0)}}, {Key: "at", Value: bson.DateTime(1_000_000)}}))
		stagedInsert(t, m, events("b", 0, 2), retryArgs(8)...)
		if st := runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_100)}); st.Retries != 1 || st.Events != 0 || deletes != 0 {
			t.Fatalf("stats %+v, %d deletes of records: want the old record's retry left out, nothing expired", st, deletes)
		}
		// Past the horizon (an hour in these tests): expired, once.
		stagedInsert(t, m, events("c", 0, 1))
		runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_000 + 2*3_600_000)})
		stagedInsert(t, m, events("c", 1, 1))
		runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_000 + 2*3_600_000 + 1)})
		if deletes != 1 {
			t.Fatalf("%d deletes of records, want 1", deletes)
		}
	})
	t.Run("a merge cut after its freeze is finished before the next freeze", func(t *testing.T) {
		m := newMem(t)
		retry := retryArgs(6)
		stagedInsert(t, m, events("a", 0, 2), retry...)
		runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true}) // then the proxy died
		stagedInsert(t, m, events("a", 0, 2), retry...)                 // the retry lands in a new staging collection
		// The proxy's next merge: what is retired, then the freeze.
		st := runMerge(t, m, merge.MergeOptions{RetiredOnly: true, Now: time.UnixMilli(1_000_100)})
		if st.Collections != 1 || st.Events != 2 || st.Frozen != 0 || st.Pending != 1 {
			t.Fatalf("stats %+v, want the left retired collection merged, the new one left", st)
		}
		if st = runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true, Now: time.UnixMilli(1_000_150)}); st.Frozen != 1 || st.Collections != 0 {
			t.Fatalf("stats %+v, want the new one frozen, nothing merged", st)
		}
		if st = runMerge(t, m, merge.MergeOptions{Now: time.UnixMilli(1_000_200)}); st.Retries != 1 || st.Events != 0 {
			t.Fatalf("stats %+v, want the retry left out", st)
		}
		for id, n := range storedEvents(t, m) {
			if n != 1 {
				t.Fatalf("event %s stored %d times", id, n)
			}
		}
	})
	for _, form := range []bucket.StagedFormat{bucket.StagedKeyed, bucket.StagedPacked} {
		t.Run("late documents go back to staging, "+stagedFormName[form], func(t *testing.T) {
			m := newMem(t)
			stagedInsert(t, m, events("a", 0, 2))
			runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true})
			// Another proxy's insert commits into the retired collection
			// after the merge read it: simulated by a plan written before it.
			m.fail["drop"] = true
			merge2 := merge.NewMerge(rwtest.InsertRule(), merge.MergeOptions{Now: time.UnixMilli(1_000_100), RetryHorizon: time.Hour})
			m.run(merge2) // plan and buckets written, drop refused
			m.fail["drop"] = false
			for name := range m.colls {
				if strings.Contains(name, "_m") {
					m.colls[name] = append(m.colls[name], lateDoc(t, form))
				}
			}
			st := runMerge(t, m, merge.MergeOptions{Now: time.UnixMilli(1_000_200), CheckLate: true})
			if st.Late != 1 || st.Collections != 1 {
				t.Fatalf("stats %+v, want 1 late document moved", st)
			}
			if st = runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_300)}); st.Events != 1 {
				t.Fatalf("stats %+v, want the late event merged", st)
			}
			storedOnce(t, m, 3)
		})
		t.Run("a crash between the move of late documents and the drop stores them once, "+stagedFormName[form], func(t *testing.T) {
			m := newMem(t)
			stagedInsert(t, m, events("a", 0, 2))
			runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true})
			m.fail["drop"] = true
			m.run(merge.NewMerge(rwtest.InsertRule(), merge.MergeOptions{Now: time.UnixMilli(1_000_100), RetryHorizon: time.Hour}))
			for name := range m.colls {
				if strings.Contains(name, "_m") {
					m.colls[name] = append(m.colls[name], lateDoc(t, form))
				}
			}
			// The late document is moved back to staging, then the proxy dies
			// before the drop (refused here).
			m.run(merge.NewMerge(rwtest.InsertRule(), merge.MergeOptions{Now: time.UnixMilli(1_000_200), RetryHorizon: time.Hour, RetiredOnly: true, CheckLate: true}))
			if n := len(m.colls[rwtest.InsertRule().StageCollection(36_000_000)]); n != 1 {
				t.Fatalf("%d documents back in staging, want the late one", n)
			}
			m.fail["drop"] = false
			// The next holder's passes, as proxy.Server.mergeStaged runs them:
			// what is retired first (the move is repeated: a duplicate key),
			// then the freeze, then what it froze.
			// (A repeated merge counts the events it planned again; its
			// buckets meet their duplicate keys.)
			st := runMerge(t, m, merge.MergeOptions{Now: time.UnixMilli(1_000_300), RetiredOnly: true, CheckLate: true})
			if st.Collections != 1 || st.Late != 1 {
				t.Fatalf("stats %+v, want the cut merge finished, its late document moved again", st)
			}
			runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true, Now: time.UnixMilli(1_000_400)})
			if st = runMerge(t, m, merge.MergeOptions{Now: time.UnixMilli(1_000_500), RetiredOnly: true, CheckLate: true}); st.Events != 1 {
				t.Fatalf("stats %+v, want the late event merged", st)
			}
			storedOnce(t, m, 3)
			for _, n := range names(m) {
				if _, ok := stage.Parse(rwtest.InsertRule(), n); ok && len(m.colls[n]) > 0 {
					t.Fatalf("staging collection %s left with %d documents", n, len(m.colls[n]))
				}
			}
		})
		t.Run("a move that lands after the next holder merged it is merged once, "+stagedFormName[form], func(t *testing.T) {
			// A holder's lease lapses while its move of a late document
			// is on its way; the next holder moves, freezes and merges
			// the same document; then the first move lands, in a new
			// collection of the old name. The events' writes were not
			// retryable: only the move's mark records the document.
			m := newMem(t)
			rule := rwtest.InsertRule()
			stagedInsert(t, m, events("a", 0, 2))
			runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true})
			m.fail["drop"] = true
			m.run(merge.NewMerge(rule, merge.MergeOptions{Now: time.UnixMilli(1_000_100), RetryHorizon: time.Hour}))
			m.fail["drop"] = false
			for name := range m.colls {
				if strings.Contains(name, "_m") {
					m.colls[name] = append(m.colls[name], lateDoc(t, form))
				}
			}
			open := rule.StageCollection(36_000_000)
			if st := runMerge(t, m, merge.MergeOptions{Now: time.UnixMilli(1_000_200), RetryHorizon: time.Hour, RetiredOnly: true, CheckLate: true}); st.Late != 1 || len(m.colls[open]) != 1 {
				t.Fatalf("stats %+v, %d documents in %s, want the late one moved there", st, len(m.colls[open]), open)
			}
			inFlight := slices.Clone(m.colls[open][0]) // the first holder's move carries the same document
			runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_300), RetryHorizon: time.Hour})
			storedOnce(t, m, 3)
			m.colls[open] = append(m.colls[open], inFlight)
			if st := runMerge(t, m, merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_400), RetryHorizon: time.Hour}); st.Retries != 1 || st.Events != 0 {
				t.Fatalf("stats %+v, want the landed copy left out", st)
			}
			storedOnce(t, m, 3)
		})
	}
	t.Run("only due collections in the background", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 1))
		st := runMerge(t, m, merge.MergeOptions{Host: &hooks{due: func(stage.Collection) bool { return false }}})
		if st.Pending != 1 || st.Events != 0 {
			t.Fatalf("stats %+v, want 1 pending", st)
		}
		st = runMerge(t, m, merge.MergeOptions{Host: &hooks{due: func(stage.Collection) bool { return true }}})
		if st.Events != 1 {
			t.Fatalf("stats %+v, want 1 merged", st)
		}
	})
	t.Run("freeze only renames", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 1))
		st := runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true})
		if st.Events != 0 || len(m.colls["readings.buckets"]) != 0 {
			t.Fatalf("freeze merged: %+v", st)
		}
		if st = runMerge(t, m, merge.MergeOptions{}); st.Events != 1 {
			t.Fatalf("merge of the frozen collection: %+v", st)
		}
	})
}

// stageAs inserts evs as the proxy stager would.
func stageAs(t *testing.T, m *mem, evs []bson.D, stager stage.Stager) {
	t.Helper()
	cmd := rwtest.SeqCmd(t, evs)
	pi, err := insert.Prepare(cmd, rwtest.InsertRule(), bson.NewObjectID)
	if err != nil {
		t.Fatal(err)
	}
	if r := m.run(stage.Insert(cmd, pi, stage.InsertEnv{Identity: "u", NewObjectID: bson.NewObjectID, Stager: stager})); bson.Raw(r.Reply).Lookup("ok").Double() != 1 {
		t.Fatalf("staged insert: %s", bson.Raw(r.Reply))
	}
}

// TestStagers: proxies stage into collections of their own. A guest (no
// writer lease) freezes only its own; the holder freezes its own, takes
// over those of a proxy that stopped and of its own previous run, and
// merges what is retired; what is left is what a flush waits for.
func TestStagers(t *testing.T) {
	rule := rwtest.InsertRule()
	a := stage.Stager{Tag: stage.StagerTag("host/a"), Gen: 100}
	b := stage.Stager{Tag: stage.StagerTag("host/b"), Gen: 200}
	m := newMem(t)
	stageAs(t, m, events("a", 0, 3), a)
	stageAs(t, m, events("b", 0, 2), b)
	openA := stage.OpenCollection(rule, 36_000_000, a)
	if c, ok := stage.Parse(rule, openA); !ok || c.Owner != a.Tag || c.Gen != 100 || c.Retired() {
		t.Fatalf("Parse(%q) = %+v, %v", openA, c, ok)
	}

	// b, a guest: its own frozen, a's left.
	st := runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true, Guest: true, Self: b.Tag, Since: 200})
	if st.Frozen != 1 || len(st.Others) != 1 || st.Others[0] != openA || len(st.Retired) != 1 || st.Events != 0 {
		t.Fatalf("guest: %+v", st)
	}
	waitFor := append(st.Others, st.Retired...)
	if left := stage.Remaining(rule, names(m), waitFor); len(left) != 2 {
		t.Fatalf("remaining before the holder merged: %v", left)
	}

	// a, the holder: merges b's retired one, freezes and merges its own.
	announce(m, rule, b.Tag, true)
	st = runMerge(t, m, merge.MergeOptions{All: true, Self: a.Tag, Since: 100, TakeOver: true})
	if st.Events != 5 || len(st.Others) != 0 {
		t.Fatalf("holder: %+v", st)
	}
	if left := stage.Remaining(rule, names(m), waitFor); len(left) != 0 {
		t.Fatalf("remaining after the holder merged: %v", left)
	}

	// b stages again, then stops; a takes it over, late documents
	// checked (moved back under the holder's names).
	b.Gen++
	stageAs(t, m, events("b", 10, 2), b)
	// a's previous run left a collection too.
	old := stage.Stager{Tag: a.Tag, Gen: 50}
	stageAs(t, m, events("a", 10, 1), old)
	announce(m, rule, b.Tag, false)
	st = runMerge(t, m, merge.MergeOptions{All: true, FreezeOnly: true, Self: a.Tag, Since: 100, TakeOver: true})
	if st.Frozen != 2 {
		t.Fatalf("takeover freeze: %+v", st)
	}
	for _, n := range names(m) {
		if c, ok := stage.Parse(rule, n); ok && c.Retired() && !c.TakenOver {
			t.Fatalf("%s frozen as its owner's, want taken over", n)
		}
	}
	if st = runMerge(t, m, merge.MergeOptions{RetiredOnly: true, Self: a.Tag, Since: 100}); st.Events != 3 {
		t.Fatalf("takeover merge: %+v", st)
	}
	total := 0
	for _, n := range storedEvents(t, m) {
		total += n
	}
	if total != 8 { // the series reuse _ids: counted, not told apart
		t.Fatalf("%d events stored, want 8", total)
	}
}

func names(m *mem) []string {
	var out []string
	for n := range m.colls {
		out = append(out, n)
	}
	return out
}

func TestParseOwned(t *testing.T) {
	rule := rwtest.InsertRule()
	// Windows before the epoch have a minus in their names.
	before := stage.OpenCollection(rule, -36_000_000, stage.Stager{Tag: "0a1b2c3d", Gen: 42})
	if c, ok := stage.Parse(rule, stage.RetiredName(before, 3)); !ok || c.Window != -86_400_000 || c.Owner != "0a1b2c3d" || c.Token != 3 {
		t.Fatalf("Parse(%q) = %+v, %v", stage.RetiredName(before, 3), c, ok)
	}
	if c, ok := stage.Parse(rule, rule.StageCollection(-36_000_000)); !ok || c.Window != -86_400_000 || c.Owner != "" {
		t.Fatalf("Parse of a shared name before the epoch: %+v, %v", c, ok)
	}
	open := stage.OpenCollection(rule, 36_000_000, stage.Stager{Tag: "0a1b2c3d", Gen: 42})
	for _, c := range []struct {
		name string
		ok   bool
		want stage.Collection
	}{
		{open, true, stage.Collection{Name: open, Owner: "0a1b2c3d", Gen: 42}},
		{stage.RetiredName(open, 7), true, stage.Collection{Name: stage.RetiredName(open, 7), Owner: "0a1b2c3d", Gen: 42, Token: 7}},
		{stage.TakenOverName(open, 8), true, stage.Collection{Name: stage.TakenOverName(open, 8), Owner: "0a1b2c3d", Gen: 42, Token: 8, TakenOver: true}},
		{open + "x", false, stage.Collection{}},
		{rule.StagePrefix() + "0_pXYZ_1", false, stage.Collection{}},
		{rule.StagePrefix() + "0_p0a1b2c3d_", false, stage.Collection{}},
		{rule.StagePrefix() + "0_p0a1b2c3d_01", false, stage.Collection{}},
	} {
		got, ok := stage.Parse(rule, c.name)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
		if ok && got.OpenName() != open {
			t.Errorf("OpenName(%q) = %q", c.name, got.OpenName())
		}
	}
}

// rolledRule is the insert rule with rollups [1h, 1d].
func rolledRule() *rules.Rule {
	rule := rwtest.InsertRule()
	rule.Rollups = []time.Duration{time.Hour, 24 * time.Hour}
	return rule
}

// mergeRolled merges everything staged of rolledRule.
func mergeRolled(t *testing.T, m *mem, opts merge.MergeOptions) merge.Stats {
	t.Helper()
	opts.All = true
	return mergeRule(t, m, rolledRule(), opts)
}

func TestMergeCountsRollups(t *testing.T) {
	want := func(t *testing.T, m *mem, a, b int) {
		t.Helper()
		for _, coll := range []string{"readings.rollup_1h", "readings.rollup_1d"} {
			if m.rolled[coll+"|a"] != a || m.rolled[coll+"|b"] != b {
				t.Fatalf("%s counts a=%d b=%d, want %d and %d (all: %v)", coll, m.rolled[coll+"|a"], m.rolled[coll+"|b"], a, b, m.rolled)
			}
		}
	}
	t.Run("merged events are counted once", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 5))
		stagedInsert(t, m, events("b", 0, 3))
		st := mergeRolled(t, m, merge.MergeOptions{})
		if st.Counted != 8 || len(st.RollupErrors) != 0 {
			t.Fatalf("stats %+v, want 8 counted", st)
		}
		want(t, m, 5, 3)
		if st := mergeRolled(t, m, merge.MergeOptions{Now: time.UnixMilli(1_000_100)}); st.Counted != 0 {
			t.Fatalf("a second merge counted %d", st.Counted)
		}
		want(t, m, 5, 3)
	})
	t.Run("a merge cut after its buckets is not counted again", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 4))
		m.fail["drop"] = true
		m.run(merge.NewMerge(rolledRule(), merge.MergeOptions{All: true, Now: time.UnixMilli(1_000_000), RetryHorizon: time.Hour}))
		m.fail["drop"] = false
		want(t, m, 4, 0)
		if st := mergeRolled(t, m, merge.MergeOptions{}); st.Collections != 1 || st.Counted != 0 {
			t.Fatalf("resume %+v, want the collection merged and nothing counted again", st)
		}
		want(t, m, 4, 0)
	})
	t.Run("a retry merged earlier is not counted", func(t *testing.T) {
		m := newMem(t)
		retry := retryArgs(7)
		stagedInsert(t, m, events("a", 0, 2), retry...)
		mergeRolled(t, m, merge.MergeOptions{})
		stagedInsert(t, m, events("a", 0, 2), retry...)
		mergeRolled(t, m, merge.MergeOptions{Now: time.UnixMilli(1_000_500)})
		want(t, m, 2, 0)
	})
	t.Run("a failed rollup write is reported, not retried", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 2))
		m.fail["rollup"] = true
		st := mergeRolled(t, m, merge.MergeOptions{})
		m.fail["rollup"] = false
		if st.Events != 2 || len(st.RollupErrors) == 0 {
			t.Fatalf("stats %+v, want the events merged and the rollup failure reported", st)
		}
		want(t, m, 0, 0)
	})
}

// bucketCounts lists the counts of the buckets of key (series s, the
// events' window) by seq.
func bucketCounts(t *testing.T, m *mem, s string) []int64 {
	t.Helper()
	var out []int64
	for seq := 0; ; seq++ {
		id := rwtest.BucketID(t, s, 36_000_000, seq)
		i := slices.IndexFunc(m.colls["readings.buckets"], func(d bsoncore.Document) bool { return d.Lookup("_id").ObjectID() == id })
		if i < 0 {
			return out
		}
		c, _ := m.colls["readings.buckets"][i].Lookup("count").AsInt64OK()
		out = append(out, c)
	}
}

// cutMerge runs a merge of the insert rule that the failure of command
// failing cuts short.
func cutMerge(m *mem, failing string, opts merge.MergeOptions) {
	m.fail[failing] = true
	opts.RetryHorizon = time.Hour
	m.run(merge.NewMerge(rwtest.InsertRule(), opts))
	m.fail[failing] = false
}

// TestMergeTopUp, with the merge reading buckets by one scan ($in), and
// by lookups (the embedded upstream's indexed _id).
func TestMergeTopUp(t *testing.T) {
	t.Run("scans", func(t *testing.T) { testMergeTopUp(t, nil) })
	t.Run("lookups", func(t *testing.T) { testMergeTopUp(t, read.IDLookupIndexed.OneScanBeats) })
}

func testMergeTopUp(t *testing.T, oneScanBeats func(int) bool) {
	locked := 0
	opts := func(now int64) merge.MergeOptions {
		return merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(now), Host: &hooks{oneScanBeats: oneScanBeats, lock: func(keys []bucket.Key) func() {
			locked += len(keys)
			return func() {}
		}}}
	}
	onceEach := func(t *testing.T, m *mem, n int) {
		t.Helper()
		onceEachStored(t, m, n)
		// One entry a bucket, and the marker: none left stale.
		if e, b := idEntries(m, rwtest.Rule().IDIndexCollection()), len(m.colls["readings.buckets"]); e != b+1 {
			t.Fatalf("%d event-id index entries for %d buckets, want one each and the marker", e, b)
		}
	}
	t.Run("the last bucket is filled before new ones start", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 4)) // maxEvents 3: buckets of 3 and 1
		runMerge(t, m, opts(1_000_000))
		stagedInsert(t, m, events("a", 4, 1))
		st := runMerge(t, m, opts(1_000_100))
		if st.ToppedUp != 1 || st.Buckets != 0 || st.Events != 1 {
			t.Fatalf("stats %+v, want the one event topped up into the last bucket", st)
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{3, 2}) {
			t.Fatalf("bucket counts %v, want [3 2]", got)
		}
		stagedInsert(t, m, events("a", 5, 3))
		st = runMerge(t, m, opts(1_000_200))
		if st.ToppedUp != 1 || st.Buckets != 1 || st.Events != 3 {
			t.Fatalf("stats %+v, want one event topped up and a new bucket of two", st)
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{3, 3, 2}) {
			t.Fatalf("bucket counts %v, want [3 3 2]", got)
		}
		if locked == 0 {
			t.Fatal("the top-ups ran without locking their keys")
		}
		onceEach(t, m, 8)
	})
	t.Run("top-ups go at most RollupStatements to an update", func(t *testing.T) {
		m := newMem(t)
		var first, second []bson.D
		for s := 0; s < 10; s++ {
			first = append(first, events(fmt.Sprint("s", s), 0, 1)...)
			second = append(second, events(fmt.Sprint("s", s), 1, 1)...)
		}
		stagedInsert(t, m, first)
		runMerge(t, m, opts(1_000_000))
		stagedInsert(t, m, second)
		o := opts(1_000_100)
		o.RollupStatements = 4
		if st := runMerge(t, m, o); st.ToppedUp != 10 {
			t.Fatalf("stats %+v, want 10 buckets topped up", st)
		}
		if m.maxBucketStmts != 4 {
			t.Fatalf("an update of the buckets carried %d statements, want at most 4 (and 4 used)", m.maxBucketStmts)
		}
		total := int64(0)
		for _, b := range m.colls["readings.buckets"] {
			c, _ := b.Lookup("count").AsInt64OK()
			total += c
		}
		if n := len(m.colls["readings.buckets"]); n != 10 || total != 20 {
			t.Fatalf("%d buckets holding %d events, want 10 holding 20", n, total)
		}
	})
	t.Run("stale entries wait, then go in one delete", func(t *testing.T) {
		m := newMem(t)
		index := rwtest.Rule().IDIndexCollection()
		deletes := 0
		m.hook = func(name, coll string) bool {
			if name == "delete" && coll == index {
				deletes++
			}
			return false
		}
		// 40 series: a top-up of each leaves 40 stale entries, under
		// the 64 that make a delete; a second top-up of each, 80.
		// Ids unique across the series, so the count of stored events
		// below counts each one.
		event := func(s, i int) bson.D {
			id := rwtest.OID(byte(i))
			id[5] = byte(s)
			return rwtest.Event(id, rwtest.DT(36_000_000+int64(i)*1000), fmt.Sprint("s", s), float64(i))
		}
		round := func(i int) []bson.D {
			var evs []bson.D
			for s := 0; s < 40; s++ {
				evs = append(evs, event(s, i))
			}
			return evs
		}
		stale := &stage.StaleEntries{}
		withStale := func(now int64) merge.MergeOptions {
			o := opts(now)
			o.Stale = stale
			return o
		}
		stagedInsert(t, m, round(0))
		runMerge(t, m, withStale(1_000_000))
		stagedInsert(t, m, round(1))
		if st := runMerge(t, m, withStale(1_000_100)); st.ToppedUp != 40 || st.StaleDropped != 0 {
			t.Fatalf("stats %+v, want 40 buckets topped up and no stale entry deleted", st)
		}
		if deletes != 0 || stale.Len() != 40 {
			t.Fatalf("%d deletes of the index, %d entries waiting; want none and 40", deletes, stale.Len())
		}
		if e, b := idEntries(m, index), len(m.colls["readings.buckets"]); e != b+1+40 {
			t.Fatalf("%d event-id index entries for %d buckets, want one each, the marker and the 40 waiting", e, b)
		}
		stagedInsert(t, m, round(2))
		if st := runMerge(t, m, withStale(1_000_200)); st.ToppedUp != 40 || st.StaleDropped != 80 {
			t.Fatalf("stats %+v, want 40 buckets topped up and 80 stale entries deleted", st)
		}
		if deletes != 1 || stale.Len() != 0 {
			t.Fatalf("%d deletes of the index, %d entries waiting; want one and none", deletes, stale.Len())
		}
		// Where _id lookups are indexed, a statement an entry (each a
		// lookup); elsewhere one {_id: {$in}} (a scan either way).
		if want := map[bool]int{true: 80, false: 0}[oneScanBeats != nil]; m.deletesByID != want {
			t.Fatalf("%d entries deleted by their _id, want %d", m.deletesByID, want)
		}
		onceEach(t, m, 120)
		// A flush (DropStale) deletes what waits.
		stagedInsert(t, m, []bson.D{event(0, 3)})
		runMerge(t, m, withStale(1_000_300))
		stagedInsert(t, m, []bson.D{event(0, 4)})
		o := withStale(1_000_400)
		o.DropStale = true
		if st := runMerge(t, m, o); st.ToppedUp != 1 || st.StaleDropped != 1 || stale.Len() != 0 {
			t.Fatalf("stats %+v (%d waiting), want the top-up's stale entry deleted at the flush", st, stale.Len())
		}
		onceEach(t, m, 122)
	})
	t.Run("a top-up costs at most the floor or a multiple of what it adds", func(t *testing.T) {
		rule := rwtest.InsertRule()
		rule.MaxEvents = 20
		floored := func(now int64, floor int) merge.MergeOptions {
			o := opts(now)
			o.TopUpFloor = floor
			return o
		}
		m := newMem(t)
		from, now := 0, int64(1_000_000)
		step := func(n, floor int, wantTopped int, want ...int64) {
			t.Helper()
			stagedInsert(t, m, events("a", from, n))
			from, now = from+n, now+100
			if st := mergeRule(t, m, rule, floored(now, floor)); st.ToppedUp != wantTopped || st.Events != n {
				t.Fatalf("merge of %d: stats %+v, want %d topped up", n, st, wantTopped)
			}
			if got := bucketCounts(t, m, "a"); !slices.Equal(got, want) {
				t.Fatalf("merge of %d: bucket counts %v, want %v", n, got, want)
			}
		}
		step(6, 2, 0, 6)
		step(1, 2, 0, 6, 1)    // 6 events over the floor, more than 4 times 1: a new bucket
		step(1, 2, 1, 6, 2)    // under the floor
		step(2, 2, 1, 6, 4)    // 2 events, at most 4 times 2
		step(2, 2, 1, 6, 6)    // 4, at most 4 times 2
		step(1, 2, 0, 6, 6, 1) // 6, more than 4 times 1
		step(4, 0, 1, 6, 6, 5) // the default floor, 128: under it
		onceEachStored(t, m, from)
	})
	t.Run("the default floor is 128 events", func(t *testing.T) {
		rule := rwtest.InsertRule()
		rule.MaxEvents = 1000
		m := newMem(t)
		var evs []bson.D
		for i := range 129 {
			evs = append(evs, rwtest.Event(rwtest.OID(byte(i)), rwtest.DT(36_000_000+int64(i)*1000), "a", float64(i)))
		}
		stagedInsert(t, m, evs[:127])
		mergeRule(t, m, rule, opts(1_000_000))
		stagedInsert(t, m, evs[127:128])
		if st := mergeRule(t, m, rule, opts(1_000_100)); st.ToppedUp != 1 {
			t.Fatalf("stats %+v, want the bucket of 127 topped up", st)
		}
		stagedInsert(t, m, evs[128:])
		if st := mergeRule(t, m, rule, opts(1_000_200)); st.ToppedUp != 0 || st.Buckets != 1 {
			t.Fatalf("stats %+v, want a new bucket after one of 128", st)
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{128, 1}) {
			t.Fatalf("bucket counts %v, want [128 1]", got)
		}
		onceEachStored(t, m, 129)
	})
	t.Run("a full last bucket is left alone", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 3))
		runMerge(t, m, opts(1_000_000))
		stagedInsert(t, m, events("a", 3, 1))
		if st := runMerge(t, m, opts(1_000_100)); st.ToppedUp != 0 || st.Buckets != 1 {
			t.Fatalf("stats %+v, want a new bucket", st)
		}
		onceEach(t, m, 4)
	})
	t.Run("a merge cut after its top-up is finished without doubling", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 1))
		runMerge(t, m, opts(1_000_000))
		stagedInsert(t, m, events("a", 1, 4))
		cutMerge(m, "drop", merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(1_000_100)})
		if st := runMerge(t, m, opts(1_000_200)); st.Collections != 1 {
			t.Fatalf("resume %+v, want the cut merge finished", st)
		}
		if got := bucketCounts(t, m, "a"); !slices.Equal(got, []int64{3, 2}) {
			t.Fatalf("bucket counts %v, want [3 2]", got)
		}
		onceEach(t, m, 5)
	})
	t.Run("a last bucket changed after the plan is an error, not overwritten", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 2))
		runMerge(t, m, opts(1_000_000))
		stagedInsert(t, m, events("a", 2, 1))
		// Cut after the plan is recorded (at the event-id index's version).
		cutMerge(m, "update", merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(1_000_100)})
		// Something outside the merge rewrites the bucket meanwhile.
		b := m.colls["readings.buckets"][0]
		m.colls["readings.buckets"][0] = bsoncore.NewDocumentBuilder().AppendObjectID("_id", b.Lookup("_id").ObjectID()).AppendInt32("count", 1).Build()
		res := m.run(merge.NewMerge(rwtest.InsertRule(), merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(1_000_200), RetryHorizon: time.Hour}))
		if msg, _ := bson.Raw(res.Reply).Lookup("errmsg").StringValueOK(); !strings.Contains(msg, "changed since the merge read it") {
			t.Fatalf("resume over a changed bucket: %s", bson.Raw(res.Reply))
		}
	})
	t.Run("a merge given up while it holds key locks releases them", func(t *testing.T) {
		m := newMem(t)
		stagedInsert(t, m, events("a", 0, 1))
		runMerge(t, m, opts(1_000_000))
		stagedInsert(t, m, events("a", 1, 1))
		held := 0
		mp := merge.NewMerge(rwtest.InsertRule(), merge.MergeOptions{All: true, TopUp: true, Now: time.UnixMilli(1_000_100), RetryHorizon: time.Hour,
			Host: &hooks{lock: func(keys []bucket.Key) func() {
				held++
				return func() { held-- }
			}}})
		// Drive it until it holds the lock, as the proxy's driver does,
		// then give it up as the driver does when the upstream fails.
		for held == 0 {
			step, done := mp.Next()
			if done {
				t.Fatal("the merge ended without locking the key it tops up")
			}
			replies := make([][]byte, len(step))
			for j, u := range step {
				replies[j] = m.answer(u)
			}
			if err := mp.Feed(replies); err != nil {
				t.Fatal(err)
			}
		}
		var rel rewrite.Plan = mp
		r, ok := rel.(rewrite.Releaser)
		if !ok {
			t.Fatal("a merge is not a rewrite.Releaser: its driver cannot give it up")
		}
		r.Release()
		if held != 0 {
			t.Fatalf("%d key locks still held after the merge was given up", held)
		}
	})
	t.Run("rollups count the new events once", func(t *testing.T) {
		m := newMem(t)
		rolled := func(now int64) merge.Stats {
			o := opts(now)
			return mergeRule(t, m, rolledRule(), o)
		}
		stagedInsert(t, m, events("a", 0, 1))
		rolled(1_000_000)
		stagedInsert(t, m, events("a", 1, 1))
		if st := rolled(1_000_100); st.ToppedUp != 1 || st.Counted != 1 {
			t.Fatalf("stats %+v, want one event topped up and counted", st)
		}
		if got := m.rolled["readings.rollup_1h|a"]; got != 2 {
			t.Fatalf("rollup count %d, want 2", got)
		}
	})
}

// upsertSeries applies series entry upserts ($min first, $max last).
func (m *mem) upsertSeries(coll string, stmts []bsoncore.Document) {
	for _, st := range stmts {
		id := st.Lookup("q", "_id")
		first, last := st.Lookup("u", "$min", "first").DateTime(), st.Lookup("u", "$max", "last").DateTime()
		i := slices.IndexFunc(m.colls[coll], func(d bsoncore.Document) bool { return d.Lookup("_id").Equal(id) })
		if i >= 0 {
			f, l, _ := bucket.SeriesBoundsOf(m.colls[coll][i])
			first, last = min(first, f), max(last, l)
		}
		d := bsoncore.NewDocumentBuilder().AppendValue("_id", id).AppendDateTime("first", first).AppendDateTime("last", last).Build()
		if i >= 0 {
			m.colls[coll][i] = d
		} else {
			m.colls[coll] = append(m.colls[coll], d)
		}
	}
}

// idEntries counts the documents of event-id index coll but its series
// entries and id-time documents: the bucket entries and the marker.
func idEntries(m *mem, coll string) int {
	n := 0
	for _, d := range m.colls[coll] {
		if !bucket.IsSeriesEntry(d) && !bucket.IsIDTimeDoc(d) {
			n++
		}
	}
	return n
}
