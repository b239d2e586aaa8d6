package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/rules"
)

// migrateTestEnv starts the embedded upstream and the in-process
// migration proxy for rule rdb.readings, and fills rdb.source with n events.
func migrateTestEnv(t *testing.T, ctx context.Context, n int, extraRule string) (*migrationEnv, *rules.Rule, []bson.D) {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	cfgFile := writeConfig(t, `
upstream:
  uri: embedded
  dataDir: `+data+`
telemetry:
  metricsListen: ""
rules:
  - namespace: rdb.readings
    timeField: ts
    metaField: sensorId
    bucket:
      span: 1h
      maxEvents: 1000
    aggregates: [value]
`+extraRule)
	cfg, err := rules.Load(rules.LoadOptions{ConfigFile: cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	rule, err := ruleOf(cfg, "rdb.readings", "migrate")
	if err != nil {
		t.Fatal(err)
	}
	env, err := startMigrationProxy(ctx, cfg, newLogger(rules.Telemetry{LogLevel: "error"}, &bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.close)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var docs []bson.D
	var items []any
	for i := 0; i < n; i++ {
		d := bson.D{{Key: "_id", Value: i}, {Key: "ts", Value: t0.Add(time.Duration(i) * time.Minute)}, {Key: "sensorId", Value: "s1"}, {Key: "value", Value: float64(i)}}
		docs = append(docs, d)
		items = append(items, d)
	}
	if _, err := env.upstream.Database("rdb").Collection("source").InsertMany(ctx, items); err != nil {
		t.Fatal(err)
	}
	return env, rule, docs
}

func migrateTestOpts(env *migrationEnv, rule *rules.Rule, batch int, out *bytes.Buffer) *migrateOptions {
	return &migrateOptions{rule: rule, fromDB: "rdb", fromColl: "source", batch: batch, out: out,
		upstream: env.upstream, viaProxy: env.viaProxy,
		stateColl: env.upstream.Database(rule.DB).Collection(migrationsCollection),
		stateID:   "rdb.source -> " + rule.Namespace}
}

func migratedIDs(t *testing.T, ctx context.Context, env *migrationEnv) (int, map[int32]int) {
	t.Helper()
	cur, err := env.viaProxy.Database("rdb").Collection("readings").Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int32]int{}
	n := 0
	for cur.Next(ctx) {
		seen[cur.Current.Lookup("_id").Int32()]++
		n++
	}
	if err := cur.Err(); err != nil {
		t.Fatal(err)
	}
	return n, seen
}

// storedOnceEach checks that the rule holds want events, each _id once.
func storedOnceEach(t *testing.T, ctx context.Context, env *migrationEnv, want int) {
	t.Helper()
	n, seen := migratedIDs(t, ctx, env)
	for id, c := range seen {
		if c != 1 {
			t.Errorf("event %d stored %d times", id, c)
		}
	}
	if n != want {
		t.Fatalf("%d events in the rule after the resumed migration, want %d", n, want)
	}
}

// TestMigrateCrashInFirstBatch: a migration killed after its first
// batch was acknowledged but before its first checkpoint (none exists
// yet) writes that batch a second time when run again.
func TestMigrateCrashInFirstBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, rule, docs := migrateTestEnv(t, ctx, 20, "")
	// Run 1, as copyAll does it: the first batch (10 events) is inserted
	// through the proxy, then the process dies before saveState.
	var first []any
	for _, d := range docs[:10] {
		first = append(first, d)
	}
	if _, err := env.viaProxy.Database("rdb").Collection("readings").InsertMany(ctx, first, options.InsertMany().SetOrdered(false)); err != nil {
		t.Fatal(err)
	}
	// Run 2.
	var out bytes.Buffer
	err := migrate(ctx, migrateTestOpts(env, rule, 10, &out))
	t.Logf("migrate: %v\n%s", err, out.String())
	storedOnceEach(t, ctx, env, 20)
}

// TestMigrateResumeSmallerBatch: a run killed inside its second
// batch of 10 (checkpoint after the first), resumed with --batch 5,
// checks only the first 5 events of the interrupted batch.
func TestMigrateResumeSmallerBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, rule, docs := migrateTestEnv(t, ctx, 30, "")
	var all []any
	for _, d := range docs[:20] {
		all = append(all, d)
	}
	if _, err := env.viaProxy.Database("rdb").Collection("readings").InsertMany(ctx, all, options.InsertMany().SetOrdered(false)); err != nil {
		t.Fatal(err)
	}
	o := migrateTestOpts(env, rule, 5, &bytes.Buffer{})
	lastID, _ := bson.Marshal(bson.D{{Key: "v", Value: 9}})
	if err := o.saveState(ctx, &migrationState{ID: o.stateID, LastID: bson.Raw(lastID).Lookup("v"), Copied: 10}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o.out = &out
	err := migrate(ctx, o)
	t.Logf("migrate: %v\n%s", err, out.String())
	storedOnceEach(t, ctx, env, 30)
}

// TestMigrateResumeMixedIDTypes: the source's _ids are numbers and
// strings (both sort in _id order: numbers first). A run checkpointed
// after its first batch (last _id a number) resumes with {_id: {$gt:
// <number>}}, which by type bracketing never matches a string _id.
func TestMigrateResumeMixedIDTypes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, rule, _ := migrateTestEnv(t, ctx, 10, "")
	t0 := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	var more []any
	for i := 0; i < 10; i++ {
		more = append(more, bson.D{{Key: "_id", Value: "e" + string(rune('a'+i))}, {Key: "ts", Value: t0.Add(time.Duration(i) * time.Minute)}, {Key: "sensorId", Value: "s1"}, {Key: "value", Value: 1.0}})
	}
	if _, err := env.upstream.Database("rdb").Collection("source").InsertMany(ctx, more); err != nil {
		t.Fatal(err)
	}
	// Run 1 copied the first batch of 5 (ids 0..4) and checkpointed it.
	var first []any
	for i := 0; i < 5; i++ {
		first = append(first, bson.D{{Key: "_id", Value: i}, {Key: "ts", Value: time.Date(2026, 1, 1, 0, i, 0, 0, time.UTC)}, {Key: "sensorId", Value: "s1"}, {Key: "value", Value: float64(i)}})
	}
	if _, err := env.viaProxy.Database("rdb").Collection("readings").InsertMany(ctx, first); err != nil {
		t.Fatal(err)
	}
	o := migrateTestOpts(env, rule, 5, &bytes.Buffer{})
	lastID, _ := bson.Marshal(bson.D{{Key: "v", Value: 4}})
	if err := o.saveState(ctx, &migrationState{ID: o.stateID, LastID: bson.Raw(lastID).Lookup("v"), Copied: 5}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o.out = &out
	err := migrate(ctx, o)
	t.Logf("migrate: %v\n%s", err, out.String())
	n, err := env.viaProxy.Database("rdb").Collection("readings").CountDocuments(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if n != 20 {
		t.Fatalf("%d events in the rule after the resumed migration, want 20", n)
	}
}

// TestRollupsRebuildStaged: events staged but not merged when
// `tsproxy rollups rebuild` starts (a proxy killed or stopped with a
// backlog). The rebuild drops the rollups, then reads the events through
// its proxy: that read merges the staged events first, and the merge
// counts them into the fresh rollups; the rebuild then counts them again.
func TestRollupsRebuildStaged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	data := filepath.Join(t.TempDir(), "data")
	cfgFile := writeConfig(t, `
upstream:
  uri: embedded
  dataDir: `+data+`
telemetry:
  metricsListen: ""
rules:
  - namespace: rdb.readings
    timeField: ts
    metaField: sensorId
    bucket:
      span: 1h
      maxEvents: 1000
    aggregates: [value]
    rollups: [1d]
    ingest: staged
    mergeAfter: 1h
`)
	cfg, err := rules.Load(rules.LoadOptions{ConfigFile: cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	rule, err := ruleOf(cfg, "rdb.readings", "rollups")
	if err != nil {
		t.Fatal(err)
	}
	env, err := startMigrationProxy(ctx, cfg, newLogger(rules.Telemetry{LogLevel: "error"}, &bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	defer env.close()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var items []any
	for i := 0; i < 10; i++ {
		items = append(items, bson.D{{Key: "ts", Value: t0.Add(time.Duration(i) * time.Minute)}, {Key: "sensorId", Value: "s1"}, {Key: "value", Value: 1.0}})
	}
	if _, err := env.viaProxy.Database("rdb").Collection("readings").InsertMany(ctx, items); err != nil {
		t.Fatal(err)
	}
	// The events are staged (mergeAfter 1h): not in a bucket yet.
	if n, err := env.upstream.Database("rdb").Collection(rule.BucketCollection).CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Logf("buckets before the rebuild: %d, %v (the events should still be staged)", n, err)
	}
	var out bytes.Buffer
	if err := rebuildRollups(ctx, env, rule, &out); err != nil {
		t.Fatalf("rebuild: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	var doc struct {
		Count int64 `bson:"count"`
	}
	if err := env.upstream.Database("rdb").Collection(rule.RollupCollection(24*time.Hour)).FindOne(ctx, bson.D{}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.Count != 10 {
		t.Fatalf("rollup count %d after the rebuild, want 10 (events counted by the merge and by the rebuild)", doc.Count)
	}
}
