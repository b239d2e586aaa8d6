package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// buildTsproxy builds the tsproxy command for tests that run it as a
// separate process.
func buildTsproxy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tsproxy")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/tsproxy/tsproxy/cmd/tsproxy")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build tsproxy: %v\n%s", err, out)
	}
	return bin
}

var progressRe = regexp.MustCompile(`\] +[0-9.]+% (\d+)/(\d+) events`)

// TestMigrate backfills 20,000 plain events (and 5 invalid ones) into a
// rule's buckets with `tsproxy migrate`, kills the process mid-way
// (SIGKILL: possibly inside a batch), resumes, and checks that the buckets
// hold each valid source event exactly once.
func TestMigrate(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	bin := buildTsproxy(t)

	// The source: plain per-event documents, written directly.
	src := direct(t).Database(db).Collection("source")
	// Ids in time order, as ObjectIds made when the events happened are.
	sent := genEvents(20000, 10, 2, 5)
	slices.SortFunc(sent, func(a, b sentEvent) int { return a.ts.Compare(b.ts) })
	for i := range sent {
		sent[i].id = bson.NewObjectID()
	}
	want := map[bson.ObjectID]bool{}
	var docs []any
	for i, e := range sent {
		want[e.id] = true
		docs = append(docs, e.doc())
		if i%4000 == 17 {
			docs = append(docs, bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "sensorId", Value: "bad"}, {Key: "value", Value: 1.0}})
		}
	}
	for i := 0; i < len(docs); i += 2000 {
		if _, err := src.InsertMany(ctx, docs[i:min(i+2000, len(docs))]); err != nil {
			t.Fatal(err)
		}
	}

	if env.emb != nil {
		// The migrate process reaches this test's embedded upstream over
		// TCP, so it cannot add the SQLite _id index that tsproxy adds to
		// its own embedded upstream (without it every bucket upsert scans
		// the collection); add it here, as `tsproxy migrate` with
		// upstream.uri: embedded does itself.
		bdb := direct(t).Database(db)
		if err := bdb.RunCommand(ctx, bson.D{{Key: "create", Value: "readings.buckets"}}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := env.emb.IndexIDs(ctx, db, "readings.buckets"); err != nil {
			t.Fatal(err)
		}
	}

	cfg := filepath.Join(t.TempDir(), "config.yaml")
	yaml := fmt.Sprintf("upstream:\n  uri: %q\ntelemetry:\n  metricsListen: \"\"\n", env.upstreamURI) + readingsRule(db, 1000)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"migrate", "--config", cfg, "--rule", db + ".readings", "--from", db + ".source", "--batch", "700"}

	// A wrong rule is refused with the rules the config has.
	out, err := exec.CommandContext(ctx, bin, "migrate", "--config", cfg, "--rule", db+".nope", "--from", db+".source").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `no rule for namespace "`+db+`.nope" in the config (rules: `+db+`.readings)`) {
		t.Fatalf("wrong rule: %v\n%s", err, out)
	}

	// First run: killed once it reported 6,000 events.
	cmd := exec.CommandContext(ctx, bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killedAt := -1
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		t.Logf("run 1: %s", line)
		if m := progressRe.FindStringSubmatch(line); m != nil {
			if n, _ := strconv.Atoi(m[1]); n >= 6000 {
				killedAt = n
				time.Sleep(150 * time.Millisecond) // likely inside the next batch
				_ = cmd.Process.Kill()
				break
			}
		}
	}
	_ = cmd.Wait()
	if killedAt < 0 {
		t.Fatalf("first run ended before it was interrupted; stderr:\n%s", stderr.String())
	}

	// Second run: resumes and completes.
	out2, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	t.Logf("run 2:\n%s", out2)
	if err != nil {
		t.Fatalf("resumed migrate: %v", err)
	}
	for _, s := range []string{"resuming " + db + ".source -> " + db + ".readings", "source 20005 events (5 skipped as invalid), buckets hold 20000 events", "migration complete: counts match"} {
		if !strings.Contains(string(out2), s) {
			t.Fatalf("resumed run does not say %q", s)
		}
	}

	// Every valid event is in the buckets exactly once.
	p := startProxy(t, proxyOptions{yaml: readingsRule(db, 1000)})
	cur, err := connect(t, p.URI()).Database(db).Collection("readings").Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[bson.ObjectID]bool{}
	n := 0
	for cur.Next(ctx) {
		id := cur.Current.Lookup("_id").ObjectID()
		if seen[id] {
			t.Fatalf("event %v stored twice", id)
		}
		if !want[id] {
			t.Fatalf("event %v was not in the source (or was invalid)", id)
		}
		seen[id] = true
		n++
	}
	if err := cur.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(sent) {
		t.Fatalf("%d events in the buckets, want %d", n, len(sent))
	}

	// A third run finds the migration done and only checks.
	out3, err := exec.CommandContext(context.Background(), bin, args...).CombinedOutput()
	if err != nil || !strings.Contains(string(out3), "migration complete: counts match") || strings.Contains(string(out3), "events/s") {
		t.Fatalf("rerun of a finished migration: %v\n%s", err, out3)
	}
}

// TestRollupsRebuild: rollups that lost increments (or gained wrong ones)
// are recomputed from the stored events by `tsproxy rollups rebuild`.
func TestRollupsRebuild(t *testing.T) {
	ctx := ctxFor(t)
	db := uniqueDB(t)
	bin := buildTsproxy(t)
	rule := readingsRule(db, 200) + "    rollups: [1h, 1d]\n"
	p := startProxy(t, proxyOptions{yaml: rule})
	coll := connect(t, p.URI()).Database(db).Collection("readings")
	sent := genEvents(1500, 3, 2, 9)
	var docs []any
	for _, e := range sent {
		docs = append(docs, e.doc())
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}

	// Damage: lost increments and a wrong one.
	up := direct(t).Database(db)
	if _, err := up.Collection("readings.rollup_1h").DeleteMany(ctx, bson.D{{Key: "meta", Value: "sensor-01"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := up.Collection("readings.rollup_1d").UpdateMany(ctx, bson.D{}, bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 100}}}}); err != nil {
		t.Fatal(err)
	}

	cfg := filepath.Join(t.TempDir(), "config.yaml")
	yaml := fmt.Sprintf("upstream:\n  uri: %q\ntelemetry:\n  metricsListen: \"\"\n", env.upstreamURI) + rule
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "rollups", "rebuild", "--config", cfg, "--rule", db+".readings").CombinedOutput()
	t.Logf("rebuild:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "1500 events counted into 2 resolutions (0 skipped)") {
		t.Fatal("rebuild did not report 1500 events")
	}
	dbh := connect(t, p.URI()).Database(db)
	checkRollups(t, ctx, dbh, time.Hour, sent)
	checkRollups(t, ctx, dbh, 24*time.Hour, sent)
}
