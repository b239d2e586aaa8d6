package admin

import (
	"errors"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
)

// runProbe runs a TimeseriesProbe against answers (by command name) and
// returns what it concluded and the commands it sent.
func runProbe(t *testing.T, answers map[string][]byte) (bool, error, []string) {
	t.Helper()
	p := TimeseriesProbe("tsproxy", "tsproxy_probe_x")
	var sent []string
	for {
		step, done := p.Next()
		if done {
			native, err := Native(p.Result().Reply)
			return native, err, sent
		}
		var replies [][]byte
		for _, u := range step {
			name := bsoncore.Document(u.Body).Index(0).Key()
			sent = append(sent, name)
			replies = append(replies, answers[name])
		}
		if err := p.Feed(replies); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTimeseriesProbe(t *testing.T) {
	ok := bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	refused := func(code int32) []byte {
		return bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", code).AppendString("errmsg", "no").Build()
	}
	listed := func(typ string) []byte {
		batch := bsoncore.NewArrayBuilder()
		if typ != "" {
			batch.AppendDocument(bsoncore.NewDocumentBuilder().AppendString("name", "tsproxy_probe_x").AppendString("type", typ).Build())
		}
		return bsoncore.NewDocumentBuilder().AppendDocument("cursor", bsoncore.NewDocumentBuilder().
			AppendInt64("id", 0).AppendString("ns", "tsproxy.$cmd.listCollections").AppendArray("firstBatch", batch.Build()).Build()).
			AppendDouble("ok", 1).Build()
	}
	for _, c := range []struct {
		name    string
		answers map[string][]byte
		native  bool
		err     error
		sent    []string
	}{
		{"MongoDB 5.0+", map[string][]byte{"create": ok, "listCollections": listed("timeseries"), "drop": ok}, true, nil, []string{"create", "listCollections", "drop"}},
		// FerretDB 2.x: the option accepted, a plain collection made.
		{"a plain collection made", map[string][]byte{"create": ok, "listCollections": listed("collection"), "drop": ok}, false, nil, []string{"create", "listCollections", "drop"}},
		{"not listed", map[string][]byte{"create": ok, "listCollections": listed(""), "drop": refused(26)}, false, nil, []string{"create", "listCollections", "drop"}},
		// MongoDB 4.4, FerretDB v1.24: the option refused; nothing to drop.
		{"the option refused", map[string][]byte{"create": refused(40415)}, false, nil, []string{"create"}},
		{"no privilege", map[string][]byte{"create": refused(13)}, false, ErrProbeUnauthorized, []string{"create"}},
	} {
		native, err, sent := runProbe(t, c.answers)
		if native != c.native || !errors.Is(err, c.err) || !slices.Equal(sent, c.sent) {
			t.Errorf("%s: native %v, %v, sent %v; want %v, %v, %v", c.name, native, err, sent, c.native, c.err, c.sent)
		}
	}
	// A listing that fails still drops the probe's collection.
	_, err, sent := runProbe(t, map[string][]byte{"create": ok, "listCollections": refused(2), "drop": ok})
	if err == nil || !slices.Equal(sent, []string{"create", "listCollections", "drop"}) {
		t.Errorf("listing refused: %v, sent %v", err, sent)
	}
}

func TestRetryableWritesProbe(t *testing.T) {
	ok := bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	inserted := bsoncore.NewDocumentBuilder().AppendInt32("n", 1).AppendDouble("ok", 1).Build()
	dupKey := bsoncore.NewDocumentBuilder().AppendInt32("n", 0).AppendArray("writeErrors", bsoncore.NewArrayBuilder().
		AppendDocument(bsoncore.NewDocumentBuilder().AppendInt32("index", 0).AppendInt32("code", 11000).Build()).Build()).AppendDouble("ok", 1).Build()
	count := func(n int32) []byte {
		return bsoncore.NewDocumentBuilder().AppendInt32("n", n).AppendDouble("ok", 1).Build()
	}
	refused := func(code int32) []byte {
		return bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", code).AppendString("errmsg", "no").Build()
	}
	for _, c := range []struct {
		name    string
		inserts [][]byte // the replies to the first and second insert
		n       int32
		want    bool
		err     error
		sent    int
	}{
		{"a replica set member: the retry answered as the first", [][]byte{inserted, inserted}, 1, true, nil, 4},
		{"the retry run again", [][]byte{inserted, dupKey}, 1, false, nil, 4},
		{"stmtIds refused (FerretDB 2.x)", [][]byte{refused(40415)}, 0, false, nil, 1},
		{"txnNumber refused (a standalone)", [][]byte{refused(20)}, 0, false, nil, 1},
		{"no privilege", [][]byte{refused(13)}, 0, false, ErrProbeUnauthorized, 1},
	} {
		p := RetryableWritesProbe("tsproxy", "tsproxy_probe_x", [16]byte{1})
		sent, inserts := 0, 0
		for {
			step, done := p.Next()
			if done {
				break
			}
			u := step[0]
			sent++
			var reply []byte
			switch bsoncore.Document(u.Body).Index(0).Key() {
			case "insert":
				reply = c.inserts[inserts]
				inserts++
			case "count":
				reply = count(c.n)
			default:
				reply = ok
			}
			if err := p.Feed([][]byte{reply}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := Retryable(p.Result().Reply)
		if got != c.want || !errors.Is(err, c.err) || sent != c.sent {
			t.Errorf("%s: %v, %v, %d commands; want %v, %v, %d", c.name, got, err, sent, c.want, c.err, c.sent)
		}
	}
}

func TestExactSumsProbe(t *testing.T) {
	ok := bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	grouped := func(s, a float64) []byte {
		row := bsoncore.NewDocumentBuilder().AppendNull("_id").AppendDouble("s", s).AppendDouble("a", a).Build()
		return bsoncore.NewDocumentBuilder().AppendDocument("cursor", bsoncore.NewDocumentBuilder().
			AppendInt64("id", 0).AppendArray("firstBatch", bsoncore.NewArrayBuilder().AppendDocument(row).Build()).Build()).
			AppendDouble("ok", 1).Build()
	}
	refused := func(code int32) []byte {
		return bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", code).AppendString("errmsg", "no").Build()
	}
	for _, c := range []struct {
		name          string
		insert, group []byte
		want          bool
		err           error
		commands      []string
	}{
		{"compensated (MongoDB)", ok, grouped(0.6, 0.19999999999999998), true, nil, []string{"insert", "aggregate", "drop"}},
		{"naive (DocumentDB)", ok, grouped(0.6000000000000001, 0.20000000000000004), false, nil, []string{"insert", "aggregate", "drop"}},
		{"no $group", ok, refused(238), false, nil, []string{"insert", "aggregate", "drop"}},
		{"no privilege", refused(13), nil, false, ErrProbeUnauthorized, []string{"insert"}},
	} {
		p := ExactSumsProbe("tsproxy", "tsproxy_probe_x")
		sent := driveProbe(t, p, map[string][]byte{"insert": c.insert, "aggregate": c.group}, ok)
		got, err := Exact(p.Result().Reply)
		if got != c.want || !errors.Is(err, c.err) || !slices.Equal(sent, c.commands) {
			t.Errorf("%s: %v, %v, %v; want %v, %v, %v", c.name, got, err, sent, c.want, c.err, c.commands)
		}
	}
}

func TestIndexUseProbe(t *testing.T) {
	ok := bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	refused := func(code int32) []byte {
		return bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", code).AppendString("errmsg", "no").Build()
	}
	explain := func(plan bsoncore.Document) []byte {
		return bsoncore.NewDocumentBuilder().AppendDocument("queryPlanner", plan).AppendDouble("ok", 1).Build()
	}
	mongo := explain(bsoncore.NewDocumentBuilder().AppendDocument("winningPlan", bsoncore.NewDocumentBuilder().
		AppendString("stage", "FETCH").AppendDocument("inputStage", bsoncore.NewDocumentBuilder().
		AppendString("stage", "IXSCAN").AppendString("indexName", indexProbeName).Build()).Build()).Build())
	documentDB := explain(bsoncore.NewDocumentBuilder().AppendDocument("Plan", bsoncore.NewDocumentBuilder().
		AppendString("Node Type", "Bitmap Heap Scan").AppendArray("Plans", bsoncore.NewArrayBuilder().AppendDocument(
		bsoncore.NewDocumentBuilder().AppendString("Node Type", "Bitmap Index Scan").AppendString("Index Name", indexProbeName).Build()).Build()).Build()).Build())
	ferretSQLite := explain(bsoncore.NewDocumentBuilder().AppendArray("Plan", bsoncore.NewArrayBuilder().
		AppendString("id=2 parent=0 notused=0 detail=SCAN c_1").Build()).Build())
	all := []string{"createIndexes", "insert", "explain", "drop"}
	for _, c := range []struct {
		name     string
		index    []byte
		explain  []byte
		want     bool
		err      error
		commands []string
	}{
		{"MongoDB: IXSCAN", ok, mongo, true, nil, all},
		{"DocumentDB: Bitmap Index Scan", ok, documentDB, true, nil, all},
		{"FerretDB v1.24: a scan", ok, ferretSQLite, false, nil, all},
		{"no createIndexes", refused(115), nil, false, nil, []string{"createIndexes", "drop"}},
		{"no privilege", refused(13), nil, false, ErrProbeUnauthorized, []string{"createIndexes"}},
	} {
		p := IndexUseProbe("tsproxy", "tsproxy_probe_x")
		sent := driveProbe(t, p, map[string][]byte{"createIndexes": c.index, "explain": c.explain}, ok)
		got, err := Used(p.Result().Reply)
		if got != c.want || !errors.Is(err, c.err) || !slices.Equal(sent, c.commands) {
			t.Errorf("%s: %v, %v, %v; want %v, %v, %v", c.name, got, err, sent, c.want, c.err, c.commands)
		}
	}
}

// driveProbe runs p one command at a time, answering each by its name
// from answers (others get fallback), and returns the names it sent.
func driveProbe(t *testing.T, p rewrite.Plan, answers map[string][]byte, fallback []byte) []string {
	t.Helper()
	var sent []string
	for {
		step, done := p.Next()
		if done {
			return sent
		}
		name := bsoncore.Document(step[0].Body).Index(0).Key()
		sent = append(sent, name)
		reply, ok := answers[name]
		if !ok {
			reply = fallback
		}
		if err := p.Feed([][]byte{reply}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUpdatesCostly: the fastest update command against the fastest
// insert command, past costlyUpdateRatio; no timings decide nothing.
func TestUpdatesCostly(t *testing.T) {
	ms := func(fs ...float64) []time.Duration {
		var out []time.Duration
		for _, f := range fs {
			out = append(out, time.Duration(f*float64(time.Millisecond)))
		}
		return out
	}
	cases := []struct {
		name             string
		updates, inserts []time.Duration
		costly           bool
	}{
		{"DocumentDB, as probed (16 ms against 0.9)", ms(19.4, 16.2, 19.1), ms(1.4, 0.9, 1.0), true},
		{"MongoDB-like: a few times an insert", ms(1.2, 0.9, 1.0), ms(0.5, 0.4, 0.45), false},
		{"one slow insert does not make updates cheap", ms(16, 17, 18), ms(30, 1, 1), true},
		{"one slow update does not make them costly", ms(40, 1, 1.1), ms(0.5, 0.5, 0.6), false},
		{"at the ratio: not costly", ms(6), ms(1), false},
		{"no timings", nil, nil, false},
	}
	for _, c := range cases {
		if got := updatesCostly(c.updates, c.inserts); got != c.costly {
			t.Errorf("%s: updatesCostly %v, want %v", c.name, got, c.costly)
		}
	}
}

// TestUpdateCostCommands: the setup's document is a bucket's size, the
// update pushes costProbeStatements times onto it, and no two rounds'
// inserts share an _id.
func TestUpdateCostCommands(t *testing.T) {
	setup := bsoncore.Document(costProbeSetup("tsproxy", "p"))
	docs, _ := setup.Lookup("documents").Array().Values()
	e, _ := docs[0].Document().Lookup("e").Array().Values()
	if len(docs) != 1 || len(e) != costProbeEvents {
		t.Fatalf("setup: %d documents, %d elements", len(docs), len(e))
	}
	stmts, _ := bsoncore.Document(costProbeUpdate("tsproxy", "p")).Lookup("updates").Array().Values()
	if len(stmts) != costProbeStatements {
		t.Fatalf("update: %d statements", len(stmts))
	}
	seen := map[int64]bool{}
	for round := range costProbeRounds {
		ins, _ := bsoncore.Document(costProbeInsert("tsproxy", "p", round)).Lookup("documents").Array().Values()
		for _, d := range ins {
			id := d.Document().Lookup("_id").Int64()
			if seen[id] || id == 0 {
				t.Fatalf("round %d: _id %d used twice (or the setup's)", round, id)
			}
			seen[id] = true
		}
	}
}

// TestUpdateCostProbe: one command a step in the order UpdatesCostlyOf
// reads their times; a refused command drops the collection and fails
// the probe; a refusal for want of rights says so and sends nothing more.
func TestUpdateCostProbe(t *testing.T) {
	ok := bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	refused := func(code int32) []byte {
		return bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", code).AppendString("errmsg", "no").Build()
	}
	run := func(answer func(name string, i int) []byte) (bool, error, []string) {
		p := UpdateCostProbe("tsproxy", "tsproxy_probe_x")
		var sent []string
		for {
			step, done := p.Next()
			if done {
				ran, err := Ran(p.Result().Reply)
				return ran, err, sent
			}
			if len(step) != 1 {
				t.Fatalf("a step of %d commands: its time would not be one command's", len(step))
			}
			name := bsoncore.Document(step[0].Body).Index(0).Key()
			sent = append(sent, name)
			if err := p.Feed([][]byte{answer(name, len(sent)-1)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ran, err, sent := run(func(string, int) []byte { return ok })
	want := []string{"insert", "update", "insert", "update", "insert", "update", "insert", "drop"}
	if !ran || err != nil || !slices.Equal(sent, want) {
		t.Fatalf("ran %v, err %v, sent %v; want %v", ran, err, sent, want)
	}
	ran, err, sent = run(func(name string, i int) []byte {
		if i == 3 {
			return refused(2)
		}
		return ok
	})
	if ran || err == nil || !slices.Equal(sent, []string{"insert", "update", "insert", "update", "drop"}) {
		t.Fatalf("a refused update: ran %v, err %v, sent %v", ran, err, sent)
	}
	_, err, sent = run(func(string, int) []byte { return refused(13) })
	if !errors.Is(err, ErrProbeUnauthorized) || !slices.Equal(sent, []string{"insert"}) {
		t.Fatalf("unauthorized: err %v, sent %v", err, sent)
	}
}

// TestUpdatesCostlyOf: the steps' times are read as the probe sends them.
func TestUpdatesCostlyOf(t *testing.T) {
	ms := time.Millisecond
	steps := []time.Duration{50 * ms, 16 * ms, 1 * ms, 19 * ms, 2 * ms, 18 * ms, 1 * ms, 5 * ms}
	costly, update, insert := UpdatesCostlyOf(steps)
	if !costly || update != 16*ms || insert != ms {
		t.Fatalf("costly %v, fastest update %v, insert %v", costly, update, insert)
	}
	if costly, _, _ := UpdatesCostlyOf(steps[:4]); costly {
		t.Fatal("a probe cut short decided")
	}
}
