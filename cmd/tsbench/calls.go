package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/cmd/tsbench/internal/benchenv"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rules"
)

// callsDB holds the calls mode's rule and its plain collections.
const callsDB = "tsbench_calls"

// callsRules is the calls mode's one rule: the ingest mode's.
func callsRules() ([]rules.Rule, error) {
	var b strings.Builder
	b.WriteString("rules:\n")
	writeIngestRule(&b, callsDB+"."+ingestColl, "")
	return benchenv.RulesFromYAML(b.String())
}

// callKinds are the five inserts of a calls round, in the order sent.
var callKinds = []struct{ name, what string }{
	{"plain", "an event into a plain collection, direct"},
	{"staged doc", "a document shaped as the proxy stages that event, into a collection of its own, direct"},
	{"proxy staged", "the event through the proxy, into the rule (staged)"},
	{"proxy passthrough", "the event through the proxy, into a plain collection (passed through)"},
	{"staged doc, form 1", "the staged document in form 1 ({_id, meta, start, packed}: every proxy reads it), into a collection of its own, direct"},
}

// benchCalls measures where a per-event insert's time goes. One client
// sends n rounds per run; a round is one insertOne of each callKinds, so
// that all four see the same machine (it drifts by more than the
// differences measured). Figures are each kind's p50, medians of runs.
// The staged document is the one the proxy wrote, in the form of the
// rule's format record; the fifth kind is the same events in form 1.
func benchCalls(e *benchenv.Env, runs, n int) error {
	ctx := context.Background()
	direct, err := mongo.Connect(options.Client().ApplyURI(e.UpstreamURI))
	if err != nil {
		return err
	}
	defer direct.Disconnect(ctx)
	proxied, err := mongo.Connect(options.Client().ApplyURI(e.ProxyURI))
	if err != nil {
		return err
	}
	defer proxied.Disconnect(ctx)
	_ = direct.Database(callsDB).Drop(ctx)
	defer func() { _ = proxied.Database(callsDB).Drop(ctx) }()

	events := ingestBatchesFrom(ingestStart, runs*n+1, 1)
	next := 0
	event := func() any { ev := events[next][0]; next++; return ev }
	rule := proxied.Database(callsDB).Collection(ingestColl)
	if _, err := rule.InsertOne(ctx, event()); err != nil {
		return fmt.Errorf("first staged insert: %w", err)
	}
	staged, stagingColl, err := stagedSample(ctx, direct.Database(callsDB))
	if err != nil {
		return err
	}
	keyed, err := keyedStaged(staged)
	if err != nil {
		return err
	}
	colls := []*mongo.Collection{
		direct.Database(callsDB).Collection("plain"),
		// Named like the staging collection (one character longer), but
		// not one the proxy reads or merges.
		direct.Database(callsDB).Collection(strings.Replace(stagingColl, "tsproxy_stage", "tsbench_stagex", 1)),
		rule,
		proxied.Database(callsDB).Collection("plain_proxied"),
		direct.Database(callsDB).Collection(strings.Replace(stagingColl, "tsproxy_stage", "tsbench_stagek", 1)),
	}
	if e.IndexIDs != nil {
		for _, c := range []*mongo.Collection{colls[0], colls[1], colls[3], colls[4]} {
			if err := c.Database().CreateCollection(ctx, c.Name()); err != nil {
				return err
			}
			if err := e.IndexIDs(ctx, callsDB, c.Name()); err != nil {
				return err
			}
		}
	}
	p50s := make([][]time.Duration, len(callKinds)) // by kind, one per run
	times := make([][]time.Duration, len(callKinds))
	for r := 0; r < runs; r++ {
		for k := range times {
			times[k] = times[k][:0]
		}
		for i := 0; i < n; i++ {
			ev := event()
			for k, c := range colls {
				doc := ev
				switch k {
				case 1:
					doc = withID(staged, bson.NewObjectID())
				case 4:
					doc = withID(keyed, bson.NewObjectID())
				}
				t0 := time.Now()
				if _, err := c.InsertOne(ctx, doc); err != nil {
					return fmt.Errorf("%s insert: %w", callKinds[k].name, err)
				}
				times[k] = append(times[k], time.Since(t0))
			}
		}
		for k := range times {
			slices.Sort(times[k])
			p50s[k] = append(p50s[k], benchenv.Percentile(times[k], 0.5))
		}
		fmt.Printf("run %d/%d done\n", r+1, runs)
	}
	printCalls(runs, n, [2]bson.D{staged, keyed}, p50s)
	return nil
}

// keyedStaged is staged, a staged document of one group, in form 1: its
// group's key and packed events at the top (bucket.StagedKeyed), as it is
// when the format record says 1.
func keyedStaged(staged bson.D) (bson.D, error) {
	var more bson.Binary
	for _, e := range staged {
		switch e.Key {
		case "meta":
			return staged, nil // form 1 already
		case "more":
			more, _ = e.Value.(bson.Binary)
		}
	}
	if more.Subtype != bucket.SubtypeArray || len(more.Data) == 0 {
		return nil, fmt.Errorf("the staged document's more is not an uncompressed packed array: %v", staged)
	}
	groups, err := bson.RawArray(more.Data).Values()
	if err != nil || len(groups) != 1 {
		return nil, fmt.Errorf("the staged document's more holds %d groups (%v), want one", len(groups), err)
	}
	g, ok := groups[0].DocumentOK()
	if !ok {
		return nil, fmt.Errorf("the staged document's group is a %s", groups[0].Type)
	}
	events, ok := g.Lookup("events").ArrayOK()
	if !ok {
		return nil, fmt.Errorf("the staged document's group has no events array: %s", g)
	}
	out := bson.D{}
	for _, e := range staged {
		if e.Key != "more" {
			out = append(out, e)
		}
	}
	return append(out,
		bson.E{Key: "meta", Value: g.Lookup("meta")},
		bson.E{Key: "start", Value: g.Lookup("start")},
		bson.E{Key: "packed", Value: bson.Binary{Subtype: bucket.SubtypeArray, Data: events}}), nil
}

// stagedSample reads the staged document the proxy wrote for the rule's
// first event, and the name of its staging collection.
func stagedSample(ctx context.Context, db *mongo.Database) (bson.D, string, error) {
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return nil, "", err
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "tsproxy_stage_") || isIDIndex(name) || isTxns(name) {
			continue
		}
		// The proxy's marker has a string _id; the staged documents
		// have ObjectIDs.
		var d bson.D
		err := db.Collection(name).FindOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$type", Value: "objectId"}}}}).Decode(&d)
		if err == nil {
			return d, name, nil
		}
	}
	return nil, "", fmt.Errorf("no staged document found in %s after an insert through the proxy", db.Name())
}

// withID is a copy of d with _id set to id.
func withID(d bson.D, id bson.ObjectID) bson.D {
	out := slices.Clone(d)
	for i := range out {
		if out[i].Key == "_id" {
			out[i].Value = id
			return out
		}
	}
	return append(bson.D{{Key: "_id", Value: id}}, out...)
}

// printCalls prints the calls mode's tables; docs are the staged document
// as the proxy wrote it and in form 1.
func printCalls(runs, n int, docs [2]bson.D, p50s [][]time.Duration) {
	fmt.Printf("\n## Where a batch-1 insert's time goes (`tsbench calls`)\n\n")
	fmt.Printf("- one client, %d runs of %d rounds; a round is one insertOne of each kind below, in turn, so all five see the same machine\n", runs, n)
	for i, what := range []string{"the staged document (as the proxy wrote it)", "in form 1"} {
		raw, _ := bson.Marshal(docs[i])
		var keys []string
		for _, e := range docs[i] {
			keys = append(keys, e.Key)
		}
		fmt.Printf("- %s: {%s}, %d bytes of BSON\n", what, strings.Join(keys, ", "), len(raw))
	}
	fmt.Println()
	fmt.Printf("| kind | what | p50 µs (median of runs) | runs' p50s |\n|---|---|---:|---|\n")
	for k, kind := range callKinds {
		fmt.Printf("| %s | %s | %.0f | %s |\n", kind.name, kind.what, benchenv.Median(field(p50s[k], micros)), joinRuns(p50s[k], func(d time.Duration) string { return fmt.Sprint(d.Microseconds()) }))
	}
	// Each part is a difference of two p50s of the same run, then the
	// median of the runs' differences.
	parts := []struct {
		what, how string
		of, minus int
	}{
		{"the upstream's cost of the staged document over the event's", "staged doc − plain", 1, 0},
		{"the hop (a command passed through the proxy)", "proxy passthrough − plain", 3, 0},
		{"the staged insert's own work in the proxy", "proxy staged − proxy passthrough", 2, 3},
		{"the proxy in all, for a per-event insert", "proxy staged − plain", 2, 0},
		{"the upstream's cost of form 1 over the staged document as written", "staged doc, form 1 − staged doc", 4, 1},
	}
	fmt.Printf("\n| part | µs (median of runs) | runs | how |\n|---|---:|---|---|\n")
	for _, pt := range parts {
		diffs := make([]time.Duration, runs)
		for r := range diffs {
			diffs[r] = p50s[pt.of][r] - p50s[pt.minus][r]
		}
		fmt.Printf("| %s | %+.0f | %s | %s |\n", pt.what, benchenv.Median(field(diffs, micros)),
			joinRuns(diffs, func(d time.Duration) string { return fmt.Sprintf("%+d", d.Microseconds()) }), pt.how)
	}
	ratios := make([]float64, runs)
	for r := range ratios {
		ratios[r] = float64(p50s[2][r]) / float64(p50s[0][r])
	}
	fmt.Printf("\ncalls through the proxy, staged / plain direct, at p50: %.2fx (runs %s; issue 13's target: 1.3x)\n",
		benchenv.Median(ratios), joinRuns(ratios, func(x float64) string { return fmt.Sprintf("%.2f", x) }))
}

func micros(d time.Duration) float64 { return float64(d.Microseconds()) }

func joinRuns[T any](xs []T, f func(T) string) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return strings.Join(out, ", ")
}
