package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/rollup"

	"github.com/tsproxy/tsproxy/rewrite/bucket"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/rules"
)

// tsproxy rollups rebuild --rule <namespace>: recomputes a rule's rollup
// collections from the stored events. Live rollups are counted at most once: a
// rollup write that failed, or a proxy that died
// between a bucket write and its rollup write, leaves them short. The
// rebuild drops the rollup collections and counts every stored event again,
// read through an in-process proxy, with the same planning as live writes.
// Run it with writes to the rule paused: events written during the rebuild
// may be counted twice or not at all. With the embedded upstream, stop the
// proxy first (one process owns the data folder).

// rebuildBatch is how many events one rebuild step reads and counts.
const rebuildBatch = 5000

func runRollups(ctx context.Context, args []string, out, logOut io.Writer) error {
	if len(args) == 0 || args[0] != "rebuild" {
		return errors.New("rollups: usage: tsproxy rollups rebuild --config FILE --rule NAMESPACE")
	}
	fs := pflag.NewFlagSet("tsproxy rollups rebuild", pflag.ContinueOnError)
	rules.RegisterFlags(fs)
	ruleNS := fs.String("rule", "", "`namespace` of the rule whose rollups are rebuilt")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg, err := rules.Load(rules.LoadOptions{Flags: fs})
	if err != nil {
		return err
	}
	rule, err := ruleOf(cfg, *ruleNS, "rollups")
	if err != nil {
		return err
	}
	if len(rule.Rollups) == 0 {
		return fmt.Errorf("rollups: rule %s has no rollups", rule.Namespace)
	}
	log := newLogger(rules.Telemetry{LogLevel: "warn", LogFormat: cfg.Telemetry.LogFormat}, logOut)
	env, err := startMigrationProxy(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer env.close()
	return rebuildRollups(ctx, env, rule, out)
}

func rebuildRollups(ctx context.Context, env *migrationEnv, rule *rules.Rule, out io.Writer) error {
	updb := env.upstream.Database(rule.DB)
	// What is staged is merged first: a merge counts its events into the
	// rollups, and the read below, which merges first, merged it after
	// the rollups were recreated and then counted it a second time.
	if err := env.viaProxy.Database("admin").RunCommand(ctx, bson.D{{Key: "tsproxyFlush", Value: rule.Namespace}}).Err(); err != nil {
		return fmt.Errorf("rollups: merge what is staged in %s first: %w", rule.Namespace, err)
	}
	for _, res := range rule.Rollups {
		if err := recreateRollupCollection(ctx, env, updb, rule, rule.RollupCollection(res)); err != nil {
			return err
		}
	}
	var upCaps caps.Upstream
	var bi bson.Raw
	if err := env.upstream.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&bi); err == nil {
		upCaps = caps.Detect(bi)
	}
	cur, err := env.viaProxy.Database(rule.DB).Collection(rule.Collection).Find(ctx, bson.D{}, options.Find().SetBatchSize(rebuildBatch))
	if err != nil {
		return fmt.Errorf("rollups: read the events of %s: %w", rule.Namespace, err)
	}
	defer cur.Close(ctx)
	var counted, skipped int
	var docs [][]byte
	flush := func() error {
		plan, sk, err := rollup.OfEvents(rule, docs, rollup.Options{MaxStatements: upCaps.MaxUpdateStatements})
		if err != nil {
			return err
		}
		skipped += sk
		docs = docs[:0]
		if plan == nil {
			return nil
		}
		for _, cmd := range plan.Commands {
			if err := runRollupCommand(ctx, updb, cmd); err != nil {
				return err
			}
		}
		counted += plan.Events
		fmt.Fprintf(out, "counted %d events\n", counted)
		return nil
	}
	for cur.Next(ctx) {
		docs = append(docs, append([]byte(nil), cur.Current...))
		if len(docs) == rebuildBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("rollups: read the events of %s: %w", rule.Namespace, err)
	}
	if err := flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "rollups of %s rebuilt: %d events counted into %d resolutions (%d skipped)\n", rule.Namespace, counted, len(rule.Rollups), skipped)
	return nil
}

// recreateRollupCollection drops a rollup collection and creates it again
// with its indexes, as the proxy does before its first rollup write.
func recreateRollupCollection(ctx context.Context, env *migrationEnv, updb *mongo.Database, rule *rules.Rule, name string) error {
	if err := updb.Collection(name).Drop(ctx); err != nil {
		return fmt.Errorf("rollups: drop %s.%s: %w", rule.DB, name, err)
	}
	_, err := updb.Collection(name).Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: bucket.FieldMeta, Value: 1}, {Key: bucket.FieldStart, Value: 1}}, Options: options.Index().SetName(bucket.IndexName),
	})
	if err != nil {
		return fmt.Errorf("rollups: index %s.%s: %w", rule.DB, name, err)
	}
	if env.indexIDs != nil {
		if err := env.indexIDs(ctx, rule.DB, name); err != nil {
			return err
		}
	}
	return nil
}

// runRollupCommand runs one planned update on the upstream. The plan's
// commands name their database in "$db", which the driver adds itself.
func runRollupCommand(ctx context.Context, updb *mongo.Database, cmd []byte) error {
	var d bson.D
	if err := bson.Unmarshal(cmd, &d); err != nil {
		return fmt.Errorf("rollups: planned command: %w", err)
	}
	kept := d[:0]
	for _, e := range d {
		if e.Key != "$db" {
			kept = append(kept, e)
		}
	}
	var reply bson.Raw
	if err := updb.RunCommand(ctx, kept).Decode(&reply); err != nil {
		return fmt.Errorf("rollups: write: %w", err)
	}
	return rollup.ReplyError(cmd, reply)
}
