package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/layout"
	"github.com/tsproxy/tsproxy/rules"
)

// Unpack: tsproxy unpack --rule <namespace> [--dry-run].
//
// On FerretDB the proxy packs what it writes whole: a bucket's events
// into one binary field, a counter's slots into another. MongoDB cannot
// see inside them: its $unwind would skip packed events (the proxy there
// refuses such a read instead, query.UnwindStages) and its $inc cannot
// count into packed slots. Buckets moved from FerretDB to MongoDB (a dump
// restored) are turned back into the array and document forms with
// this, once, before or while proxies serve them. Each bucket is replaced
// only if it has not changed since it was read (its packed field and its
// count), so a write that lands meanwhile is never undone; such a bucket
// is counted and left for a second run. Slots buckets need no step: their
// next write rewrites them in the upstream's form, and reads take both.

// unpackKind is a layout's packed field, the count a replacement is also
// conditioned on, and the unpacking of a bucket.
type unpackKind struct {
	packed, count string
	unpack        func([]byte) ([]byte, bool, error)
}

func unpackKindOf(rule *rules.Rule) (unpackKind, error) {
	switch rule.Layout {
	case rules.LayoutEvents:
		return unpackKind{packed: bucket.FieldPacked, count: bucket.FieldCount, unpack: func(b []byte) ([]byte, bool, error) {
			return bucket.UnpackedEvents(b)
		}}, nil
	case rules.LayoutCounter:
		return unpackKind{packed: rules.BucketSlots, count: rules.BucketTotal, unpack: func(b []byte) ([]byte, bool, error) {
			return layout.UnpackedCounter(b)
		}}, nil
	}
	return unpackKind{}, fmt.Errorf("unpack: rule %s has the %s layout, whose buckets need no unpacking (its next write rewrites a packed bucket, and reads take both forms)", rule.Namespace, rule.Layout)
}

// unpackStats counts one collection's buckets.
type unpackStats struct {
	unpacked, changed int64
}

// runUnpack is the unpack subcommand.
func runUnpack(ctx context.Context, args []string, out, logOut io.Writer) error {
	rc, err := openRuleCommand(ctx, "unpack", args, logOut, "`namespace` of the rule whose buckets are unpacked", "count the packed buckets, change nothing")
	if err != nil {
		return err
	}
	defer rc.up.close()
	dryRun := &rc.dryRun
	rule, err := ruleOf(rc.cfg, rc.ns, "unpack")
	if err != nil {
		return err
	}
	kind, err := unpackKindOf(rule)
	if err != nil {
		return err
	}
	up := rc.up
	db := up.Database(rule.DB)
	colls, err := bucketCollections(ctx, db, rule)
	if err != nil {
		return err
	}
	var changed int64
	for _, coll := range colls {
		st, err := unpackCollection(ctx, db.Collection(coll), kind, *dryRun)
		if err != nil {
			return fmt.Errorf("unpack %s.%s: %w", rule.DB, coll, err)
		}
		verb := "unpacked"
		if *dryRun {
			verb = "packed (dry run: left as they are)"
		}
		fmt.Fprintf(out, "%s.%s: %d buckets %s", rule.DB, coll, st.unpacked, verb)
		if st.changed > 0 {
			fmt.Fprintf(out, ", %d changed while being read and left packed", st.changed)
		}
		fmt.Fprintln(out)
		changed += st.changed
	}
	if changed > 0 {
		return fmt.Errorf("unpack: %d buckets changed while being unpacked; run it again", changed)
	}
	return nil
}

// bucketCollections are the collections of rule's buckets that exist:
// its bucket collection and, partitioned, its partitions.
func bucketCollections(ctx context.Context, db *mongo.Database, rule *rules.Rule) ([]string, error) {
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("unpack: list the collections of %s: %w", db.Name(), err)
	}
	var out []string
	for _, n := range names {
		if _, part := rule.ParsePartition(n); n == rule.BucketCollection || rule.Partitioned() && part {
			out = append(out, n)
		}
	}
	return out, nil
}

// unpackCollection unpacks the packed buckets of coll, each replaced only
// where its packed field and count are still those it was read with.
func unpackCollection(ctx context.Context, coll *mongo.Collection, kind unpackKind, dryRun bool) (unpackStats, error) {
	var st unpackStats
	cur, err := coll.Find(ctx, bson.D{{Key: kind.packed, Value: bson.D{{Key: "$type", Value: "binData"}}}})
	if err != nil {
		return st, err
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		doc := cur.Current
		repl, ok, err := kind.unpack(doc)
		if err != nil {
			return st, err
		}
		if !ok {
			continue
		}
		if dryRun {
			st.unpacked++
			continue
		}
		filter := bson.D{{Key: "_id", Value: doc.Lookup("_id")}, {Key: kind.packed, Value: doc.Lookup(kind.packed)}}
		if c, err := doc.LookupErr(kind.count); err == nil {
			filter = append(filter, bson.E{Key: kind.count, Value: c})
		}
		res, err := coll.ReplaceOne(ctx, filter, bson.Raw(repl))
		if err != nil {
			return st, fmt.Errorf("replace bucket %s: %w", doc.Lookup("_id"), err)
		}
		if res.MatchedCount == 0 {
			st.changed++
			continue
		}
		st.unpacked++
	}
	return st, cur.Err()
}

// ruleOf is the rule of namespace ns in the config, or an error for
// command cmd that lists the rules there are.
func ruleOf(cfg *rules.Config, ns, cmd string) (*rules.Rule, error) {
	db, coll, _ := strings.Cut(ns, ".")
	if rule := cfg.RuleSet().Lookup(db, coll); rule != nil {
		return rule, nil
	}
	var names []string
	for _, r := range cfg.Rules {
		names = append(names, r.Namespace)
	}
	return nil, fmt.Errorf("%s: no rule for namespace %q in the config (rules: %s)", cmd, ns, strings.Join(names, ", "))
}

// ruleCommand is what a subcommand on one rule's buckets (unpack,
// summaries) starts with: the config, an upstream client, the rule's
// namespace and --dry-run.
type ruleCommand struct {
	cfg    *rules.Config
	up     *upstreamClient
	ns     string
	dryRun bool
	log    *slog.Logger
}

// openRuleCommand parses the flags of subcommand name (--rule, with
// ruleHelp, and --dry-run, with dryHelp), loads the config and opens the
// upstream.
func openRuleCommand(ctx context.Context, name string, args []string, logOut io.Writer, ruleHelp, dryHelp string) (*ruleCommand, error) {
	fs := pflag.NewFlagSet("tsproxy "+name, pflag.ContinueOnError)
	rules.RegisterFlags(fs)
	ruleNS := fs.String("rule", "", ruleHelp)
	dryRun := fs.Bool("dry-run", false, dryHelp)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *ruleNS == "" {
		return nil, fmt.Errorf("%s: --rule <namespace> is required", name)
	}
	cfg, err := rules.Load(rules.LoadOptions{Flags: fs})
	if err != nil {
		return nil, err
	}
	log := newLogger(rules.Telemetry{LogLevel: "warn", LogFormat: cfg.Telemetry.LogFormat}, logOut)
	up, err := openUpstream(ctx, cfg, log, name)
	if err != nil {
		return nil, err
	}
	return &ruleCommand{cfg: cfg, up: up, ns: *ruleNS, dryRun: *dryRun, log: log}, nil
}
