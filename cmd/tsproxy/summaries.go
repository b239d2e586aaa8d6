package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/proxy/tier/lease"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Summaries: tsproxy summaries --rule <namespace> [--dry-run].
//
// A bucket keeps the min and max of the fields its rule aggregated when
// it was written, and says which (bucket.FieldSummed); reads prune by a
// field's summaries, and the summaries answer for it, only in buckets
// that say so. An index on a measurement of a created time-series
// collection, or a field added to a config rule's aggregates, serves the
// buckets written after it; this gives the older ones the summaries,
// computed from their events, before or while proxies serve them. Each
// bucket is updated only if it is still as it was read (its count and
// its events), so a write that lands meanwhile is never undone; such a
// bucket is counted and left for another run, which also resumes an
// interrupted one (buckets done are skipped).

type summariesStats struct {
	summed, changed int64
}

// runSummaries is the summaries subcommand.
func runSummaries(ctx context.Context, args []string, out, logOut io.Writer) error {
	rc, err := openRuleCommand(ctx, "summaries", args, logOut, "`namespace` of the rule (config.yaml's, or a created time-series collection) whose older buckets get their summaries", "count the buckets without them, change nothing")
	if err != nil {
		return err
	}
	defer rc.up.close()
	up, dryRun := rc.up, &rc.dryRun
	rule, err := summariesRule(ctx, rc.cfg, up.Client, rc.ns)
	if err != nil {
		return err
	}
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		return fmt.Errorf("summaries: rule %s: %w", rule.Namespace, err)
	}
	if len(lim.Aggregates) == 0 {
		return fmt.Errorf("summaries: rule %s keeps no summaries of measurements (no aggregates in config.yaml, no index on a measurement)", rule.Namespace)
	}
	db := up.Database(rule.DB)
	colls, err := bucketCollections(ctx, db, rule)
	if err != nil {
		return err
	}
	// FerretDB applies an update to the document it read, not to the one
	// it finds when it writes, so a merge's top-up of a bucket between the
	// two would be undone: the updates are made under the rule's writer
	// lease, which every merge, update and delete there takes too (on
	// MongoDB, whose updates are atomic, it costs one insert).
	wl, err := openWriterLease(ctx, rc, rule, rc.log)
	if err != nil {
		return err
	}
	defer wl.release()
	var changed int64
	for _, coll := range colls {
		st, err := summarizeCollection(ctx, db, coll, rule, lim, *dryRun, out, wl.ensure)
		if err != nil {
			return fmt.Errorf("summaries %s.%s: %w", rule.DB, coll, err)
		}
		verb := "given the summaries of"
		if *dryRun {
			verb = "without the summaries of (dry run: left as they are)"
		}
		fmt.Fprintf(out, "%s.%s: %d buckets %s %v", rule.DB, coll, st.summed, verb, lim.Aggregates)
		if st.changed > 0 {
			fmt.Fprintf(out, ", %d changed while being read and left for another run", st.changed)
		}
		fmt.Fprintln(out)
		changed += st.changed
	}
	if changed > 0 {
		return fmt.Errorf("summaries: %d buckets changed while being read; run it again", changed)
	}
	return nil
}

// summariesRule is the rule of namespace ns: config.yaml's, else the
// created time-series collection's in the catalog.
func summariesRule(ctx context.Context, cfg *rules.Config, c *mongo.Client, ns string) (*rules.Rule, error) {
	if rule, err := ruleOf(cfg, ns, "summaries"); err == nil {
		return rule, nil
	}
	raw, err := c.Database(rules.CatalogDB).Collection(rules.CatalogCollection).FindOne(ctx, bson.D{{Key: "_id", Value: ns}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("summaries: no rule for namespace %q in the config, and no time-series collection of that name", ns)
	}
	if err != nil {
		return nil, fmt.Errorf("summaries: reading the time-series catalog: %w", err)
	}
	rule, err := admin.CreatedRuleOf(raw)
	if err != nil {
		return nil, fmt.Errorf("summaries: %w", err)
	}
	return rule, nil
}

// summarizeCollection gives each bucket of coll that lacks the
// summaries of an aggregate those summaries (bucket.SummariesUpdate),
// printing its progress every 1,000 buckets.
func summarizeCollection(ctx context.Context, db *mongo.Database, coll string, rule *rules.Rule, lim bucket.Limits, dryRun bool, out io.Writer, ensureLease func() error) (summariesStats, error) {
	var st summariesStats
	var lacking bson.A
	for _, f := range lim.Aggregates {
		lacking = append(lacking, bson.D{{Key: bucket.FieldSummed + "." + f, Value: bson.D{{Key: "$exists", Value: false}}}})
	}
	cur, err := db.Collection(coll).Find(ctx, bson.D{{Key: "$or", Value: lacking}})
	if err != nil {
		return st, err
	}
	defer cur.Close(ctx)
	for cur.Next(ctx) {
		stmt, ok, err := bucket.SummariesUpdate(cur.Current, rule, lim)
		if err != nil {
			return st, fmt.Errorf("bucket %s: %w", cur.Current.Lookup("_id"), err)
		}
		if !ok {
			continue
		}
		if dryRun {
			st.summed++
			continue
		}
		if err := ensureLease(); err != nil {
			return st, err
		}
		var reply struct {
			N int64 `bson:"n"`
		}
		cmd := bson.D{{Key: "update", Value: coll}, {Key: "updates", Value: bson.A{bson.Raw(stmt)}}}
		if err := db.RunCommand(ctx, cmd).Decode(&reply); err != nil {
			return st, fmt.Errorf("update bucket %s: %w", cur.Current.Lookup("_id"), err)
		}
		if reply.N == 0 {
			st.changed++
			continue
		}
		if st.summed++; st.summed%1000 == 0 {
			fmt.Fprintf(out, "%s.%s: %d buckets so far\n", db.Name(), coll, st.summed)
		}
	}
	return st, cur.Err()
}

// writerLease is a subcommand's hold of a rule's writer lease.
type writerLease struct {
	ensure  func() error
	release func()
}

// openWriterLease dials the upstream for rule's writer lease, under a
// name of the subcommand's own: taken by the first ensure, renewed by
// the later ones, released at the end. While a proxy writes the rule
// (its merges), ensure fails naming it.
func openWriterLease(ctx context.Context, rc *ruleCommand, rule *rules.Rule, log *slog.Logger) (*writerLease, error) {
	dialer, err := upstream.NewDialer(upstream.Options{URI: rc.up.handle.uri, DialTimeout: rc.cfg.Upstream.DialTimeout, TLS: rc.up.tls})
	if err != nil {
		return nil, err
	}
	conn, err := dialer.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("summaries: dial the upstream for the writer lease: %w", err)
	}
	host, _ := os.Hostname()
	set := lease.NewSet(0, host+"/tsproxy summaries")
	return &writerLease{
		ensure: func() error {
			if err := set.Ensure(conn, rule.DB, rule.Collection, log); err != nil {
				return fmt.Errorf("summaries: %w; run it again when no proxy merges the rule (its writes are staged meanwhile), or stop them", err)
			}
			return nil
		},
		release: func() {
			for _, h := range set.TakeHeld() {
				_ = set.Client(conn, h.DB, h.Coll).Release(h.Term, time.Now())
			}
			conn.Close()
		},
	}, nil
}
