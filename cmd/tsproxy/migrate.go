package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/tsproxy/tsproxy/proxy"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Backfill: tsproxy migrate --rule <namespace> --from <db.collection>.
//
// The source collection of plain per-event documents is read from the
// upstream in _id order and written into the rule's buckets through an
// in-process proxy, so exactly the rewrite apps get (validation, bucket
// fills, rollups). After each batch is acknowledged, the last _id copied is
// checkpointed in <rule db>.tsproxy_migrations; a rerun resumes after it.
// The one batch that may have been written in part before an interruption
// (after the checkpoint) is checked event by event on resume, so no event
// is written twice. At the end the events in the buckets over the source's
// time range are counted against the source.

// migrationsCollection holds one state document per (source, rule).
const migrationsCollection = "tsproxy_migrations"

// Codes of write errors that mean "this event is invalid for the rule":
// such events are skipped and counted, not retried.
var eventRejectCodes = map[int]bool{2: true /* BadValue */, 22: true /* InvalidBSON */, 10334: true /* BSONObjectTooLarge */}

type migrateOptions struct {
	rule      *rules.Rule
	fromDB    string
	fromColl  string
	batch     int
	out       io.Writer
	proxyURI  string // the in-process proxy
	upstream  *mongo.Client
	viaProxy  *mongo.Client
	stateColl *mongo.Collection
	stateID   string
}

// migrationState is the checkpoint document.
type migrationState struct {
	ID      string        `bson:"_id"`
	LastID  bson.RawValue `bson:"lastId,omitempty"`
	Copied  int64         `bson:"copied"`
	Skipped int64         `bson:"skipped"`
	Done    bool          `bson:"done"`
	Updated time.Time     `bson:"updated"`
}

// runMigrate is the migrate subcommand.
func runMigrate(ctx context.Context, args []string, out, logOut io.Writer) error {
	fs := pflag.NewFlagSet("tsproxy migrate", pflag.ContinueOnError)
	rules.RegisterFlags(fs)
	ruleNS := fs.String("rule", "", "`namespace` of the rule whose buckets receive the events")
	from := fs.String("from", "", "source `db.collection` of plain per-event documents")
	batch := fs.Int("batch", 1000, "events per insert `n`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ruleNS == "" || *from == "" {
		return errors.New("migrate: --rule <namespace> and --from <db.collection> are required")
	}
	if *batch < 1 || *batch > 100_000 {
		return fmt.Errorf("migrate: --batch %d is out of range [1, 100000]", *batch)
	}
	fromDB, fromColl, ok := strings.Cut(*from, ".")
	if !ok || fromDB == "" || fromColl == "" {
		return fmt.Errorf("migrate: --from %q is not db.collection", *from)
	}
	cfg, err := rules.Load(rules.LoadOptions{Flags: fs})
	if err != nil {
		return err
	}
	rule, err := ruleOf(cfg, *ruleNS, "migrate")
	if err != nil {
		return err
	}
	if *from == rule.Namespace || *from == rule.BucketNamespace() || cfg.RuleSet().Lookup(fromDB, fromColl) != nil {
		return fmt.Errorf("migrate: --from %q is a bucketed namespace or bucket collection; name the plain source collection", *from)
	}
	log := newLogger(rules.Telemetry{LogLevel: "warn", LogFormat: cfg.Telemetry.LogFormat}, logOut)

	env, err := startMigrationProxy(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer env.close()
	o := &migrateOptions{rule: rule, fromDB: fromDB, fromColl: fromColl, batch: *batch, out: out,
		upstream: env.upstream, viaProxy: env.viaProxy,
		stateColl: env.upstream.Database(rule.DB).Collection(migrationsCollection),
		stateID:   *from + " -> " + rule.Namespace}
	return migrate(ctx, o)
}

// migrationEnv is the in-process proxy and the two clients of a migration.
type migrationEnv struct {
	upstream, viaProxy *mongo.Client
	close              func()
	// indexIDs is the embedded upstream's _id index hook (nil otherwise).
	indexIDs func(context.Context, string, string) error
}

func startMigrationProxy(ctx context.Context, cfg *rules.Config, log *slog.Logger) (*migrationEnv, error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) (*migrationEnv, error) { closeAll(); return nil, err }

	up, err := openUpstream(ctx, cfg, log, "migrate")
	if err != nil {
		return fail(err)
	}
	closers = append(closers, up.close)
	indexIDs := up.handle.indexIDs
	dialer, err := upstream.NewDialer(upstream.Options{URI: up.handle.uri, DialTimeout: cfg.Upstream.DialTimeout, TLS: up.tls})
	if err != nil {
		return fail(err)
	}
	// One migration writes at a time, under a name of its own: a run
	// resumed after a crash takes its writer lease back at once, and a
	// migration beside a running proxy that writes the same rule is
	// refused clearly on upstreams that need a single writer.
	host, _ := os.Hostname()
	srv, err := proxy.New(proxy.Options{Dialer: dialer, Rules: cfg.RuleSet(), Logger: log, IndexIDs: indexIDs,
		DropOrphanedTable: up.handle.dropOrphanedTable, WriterID: host + "/tsproxy migrate"})
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(fmt.Errorf("migrate: listen: %w", err))
	}
	go func() { _ = srv.Serve(ln) }()
	closers = append(closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	via, err := connectClient("mongodb://"+ln.Addr().String()+"/", nil)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() { _ = via.Disconnect(context.Background()) })
	return &migrationEnv{upstream: up.Client, viaProxy: via, close: closeAll, indexIDs: indexIDs}, nil
}

// upstreamClient is a client straight to the configured upstream (the
// embedded one started here), with what a command needs to dial it too.
type upstreamClient struct {
	*mongo.Client
	handle upstreamHandle
	tls    *tls.Config
	close  func()
}

// openUpstream connects a client straight to the configured upstream
// and pings it; cmd names the command in its errors. unpack reads and
// replaces buckets as they are stored through it; migrate and rollups
// also start a proxy on it.
func openUpstream(ctx context.Context, cfg *rules.Config, log *slog.Logger, cmd string) (*upstreamClient, error) {
	uh, err := startUpstream(cfg, log)
	if err != nil {
		return nil, err
	}
	upTLS, err := upstreamTLS(cfg.Upstream)
	if err != nil {
		uh.close()
		return nil, err
	}
	client, err := connectClient(uh.uri, upTLS)
	if err != nil {
		uh.close()
		return nil, fmt.Errorf("%s: %w", cmd, err)
	}
	uc := &upstreamClient{Client: client, handle: uh, tls: upTLS, close: func() {
		_ = client.Disconnect(context.Background())
		uh.close()
	}}
	if err := client.Ping(ctx, nil); err != nil {
		uc.close()
		return nil, fmt.Errorf("%s: upstream %s: %w", cmd, rules.Redact(uh.uri), err)
	}
	return uc, nil
}

func connectClient(uri string, tlsCfg *tls.Config) (*mongo.Client, error) {
	o := options.Client().ApplyURI(uri).SetServerSelectionTimeout(30 * time.Second).SetTimeout(5 * time.Minute)
	if tlsCfg != nil {
		o.SetTLSConfig(tlsCfg)
	}
	c, err := mongo.Connect(o)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", rules.Redact(uri), err)
	}
	return c, nil
}

// migrate copies the source into the rule's buckets from the checkpoint on.
func migrate(ctx context.Context, o *migrateOptions) error {
	src := o.upstream.Database(o.fromDB).Collection(o.fromColl)
	dst := o.viaProxy.Database(o.rule.DB).Collection(o.rule.Collection)

	st, resumed, err := o.loadState(ctx)
	if err != nil {
		return err
	}
	total, err := src.CountDocuments(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("migrate: count %s.%s: %w", o.fromDB, o.fromColl, err)
	}
	if resumed {
		fmt.Fprintf(o.out, "resuming %s: %d events copied, %d skipped before\n", o.stateID, st.Copied, st.Skipped)
	} else {
		fmt.Fprintf(o.out, "migrating %s: %d source events\n", o.stateID, total)
	}
	if !st.Done {
		if err := o.copyAll(ctx, src, dst, st, resumed, total); err != nil {
			return err
		}
	}
	return o.finalCheck(ctx, src, dst, st)
}

func (o *migrateOptions) loadState(ctx context.Context) (*migrationState, bool, error) {
	var st migrationState
	err := o.stateColl.FindOne(ctx, bson.D{{Key: "_id", Value: o.stateID}}).Decode(&st)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return &migrationState{ID: o.stateID}, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("migrate: read checkpoint in %s.%s: %w", o.rule.DB, migrationsCollection, err)
	}
	return &st, true, nil
}

func (o *migrateOptions) saveState(ctx context.Context, st *migrationState) error {
	st.Updated = time.Now().UTC()
	_, err := o.stateColl.ReplaceOne(ctx, bson.D{{Key: "_id", Value: st.ID}}, st, options.Replace().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("migrate: write checkpoint: %w", err)
	}
	return nil
}

// copyAll reads the source after the checkpoint in _id order and writes it
// in batches. Batches leave out the events the rule holds already, from
// the first on, until one finds none: a run killed before its first
// checkpoint, or resumed with a smaller --batch than the interrupted
// batch, stored them twice.
func (o *migrateOptions) copyAll(ctx context.Context, src, dst *mongo.Collection, st *migrationState, resumed bool, total int64) error {
	filter := bson.D{}
	if st.LastID.Type != 0 {
		filter = afterID(st.LastID)
	}
	cur, err := src.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetBatchSize(int32(o.batch)))
	if err != nil {
		return fmt.Errorf("migrate: read %s.%s: %w", o.fromDB, o.fromColl, err)
	}
	defer cur.Close(ctx)
	t0 := time.Now()
	startCopied := st.Copied + st.Skipped
	check := true
	var docs []bson.Raw
	flush := func() error {
		if len(docs) == 0 {
			return nil
		}
		batch := docs
		if check {
			var err error
			if batch, err = o.withoutStored(ctx, dst, docs); err != nil {
				return err
			}
			n := len(docs) - len(batch)
			if n > 0 {
				fmt.Fprintf(o.out, "resume: %d events of the interrupted run were already stored; not written again\n", n)
				st.Copied += int64(n)
			}
			check = n > 0
		}
		copied, skipped, err := o.writeBatch(ctx, dst, batch)
		if err != nil {
			return err
		}
		st.Copied += copied
		st.Skipped += skipped
		st.LastID = docs[len(docs)-1].Lookup("_id")
		if err := o.saveState(ctx, st); err != nil {
			return err
		}
		o.progress(st, total, startCopied, t0)
		docs = docs[:0]
		return nil
	}
	for cur.Next(ctx) {
		docs = append(docs, append(bson.Raw(nil), cur.Current...))
		if len(docs) == o.batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("migrate: read %s.%s: %w", o.fromDB, o.fromColl, err)
	}
	if err := flush(); err != nil {
		return err
	}
	st.Done = true
	return o.saveState(ctx, st)
}

// idTypeOrder is BSON's sort order of the types an _id may have, by
// their $type aliases (numbers compare with each other, as strings do
// with symbols).
var idTypeOrder = [][]string{
	{"int", "long", "double"}, {"string"}, {"object"}, {"binData"},
	{"objectId"}, {"bool"}, {"date"}, {"timestamp"}, {"regex"},
}

// afterID matches the _ids after last in _id order. {$gt: last} alone
// matches only _ids of last's type (type bracketing), and a resumed run
// never read the events whose _ids were of a type sorting after it.
func afterID(last bson.RawValue) bson.D {
	gt := bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: last}}}}
	class := slices.IndexFunc(idTypeOrder, func(aliases []string) bool { return slices.Contains(aliases, typeAlias(last.Type)) })
	if class < 0 || class == len(idTypeOrder)-1 {
		return gt
	}
	var later bson.A
	for _, aliases := range idTypeOrder[class+1:] {
		for _, a := range aliases {
			later = append(later, a)
		}
	}
	return bson.D{{Key: "$or", Value: bson.A{gt, bson.D{{Key: "_id", Value: bson.D{{Key: "$type", Value: later}}}}}}}
}

// typeAlias is the $type alias of t, among idTypeOrder's ("" for others).
func typeAlias(t bson.Type) string {
	switch t {
	case bson.TypeInt32:
		return "int"
	case bson.TypeInt64:
		return "long"
	case bson.TypeDouble:
		return "double"
	case bson.TypeString:
		return "string"
	case bson.TypeEmbeddedDocument:
		return "object"
	case bson.TypeBinary:
		return "binData"
	case bson.TypeObjectID:
		return "objectId"
	case bson.TypeBoolean:
		return "bool"
	case bson.TypeDateTime:
		return "date"
	case bson.TypeTimestamp:
		return "timestamp"
	case bson.TypeRegex:
		return "regex"
	}
	return ""
}

// withoutStored drops from docs the events whose _id the rule's namespace
// already holds (read through the proxy, within the batch's time range).
func (o *migrateOptions) withoutStored(ctx context.Context, dst *mongo.Collection, docs []bson.Raw) ([]bson.Raw, error) {
	ids := make(bson.A, 0, len(docs))
	for _, d := range docs {
		ids = append(ids, d.Lookup("_id"))
	}
	cur, err := dst.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("migrate: check the interrupted batch: %w", err)
	}
	defer cur.Close(ctx)
	stored := map[string]bool{}
	for cur.Next(ctx) {
		stored[cur.Current.Lookup("_id").String()] = true
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("migrate: check the interrupted batch: %w", err)
	}
	out := make([]bson.Raw, 0, len(docs))
	for _, d := range docs {
		if !stored[d.Lookup("_id").String()] {
			out = append(out, d)
		}
	}
	return out, nil
}

// writeBatch inserts docs through the proxy, unordered: events the rule
// refuses (no valid timeField, a non-numeric aggregate...) are skipped and
// reported; any other failure stops the migration before the checkpoint.
func (o *migrateOptions) writeBatch(ctx context.Context, dst *mongo.Collection, docs []bson.Raw) (copied, skipped int64, err error) {
	if len(docs) == 0 {
		return 0, 0, nil
	}
	items := make([]any, len(docs))
	for i, d := range docs {
		items[i] = d
	}
	_, err = dst.InsertMany(ctx, items, options.InsertMany().SetOrdered(false))
	if err == nil {
		return int64(len(docs)), 0, nil
	}
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || bwe.WriteConcernError != nil {
		return 0, 0, fmt.Errorf("migrate: write batch: %w", err)
	}
	for _, we := range bwe.WriteErrors {
		if !eventRejectCodes[we.Code] {
			return 0, 0, fmt.Errorf("migrate: write batch: event %v: %s (code %d)", docs[we.Index].Lookup("_id"), we.Message, we.Code)
		}
	}
	for i, we := range bwe.WriteErrors {
		if i < 3 {
			fmt.Fprintf(o.out, "skipped event %v: %s\n", docs[we.Index].Lookup("_id"), we.Message)
		}
	}
	skipped = int64(len(bwe.WriteErrors))
	return int64(len(docs)) - skipped, skipped, nil
}

func (o *migrateOptions) progress(st *migrationState, total, startDone int64, t0 time.Time) {
	done := st.Copied + st.Skipped
	pct := 100.0
	if total > 0 {
		pct = min(100, 100*float64(done)/float64(total))
	}
	const width = 30
	filled := int(pct / 100 * width)
	rate := float64(done-startDone) / max(time.Since(t0).Seconds(), 1e-3)
	fmt.Fprintf(o.out, "[%s%s] %5.1f%% %d/%d events, %d skipped, %.0f events/s\n",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), pct, done, total, st.Skipped, rate)
}

// finalCheck compares the source with the events in the buckets over the
// source's time range: they must hold every copied event. More events there
// than were copied means apps wrote into the same range too (reported, not
// an error).
func (o *migrateOptions) finalCheck(ctx context.Context, src, dst *mongo.Collection, st *migrationState) error {
	total, err := src.CountDocuments(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("migrate: count the source: %w", err)
	}
	tf := o.rule.TimeField
	first, last, ok, err := timeRange(ctx, src, tf)
	if err != nil {
		return err
	}
	var inBuckets int64
	if ok {
		inBuckets, err = dst.CountDocuments(ctx, bson.D{{Key: tf, Value: bson.D{{Key: "$gte", Value: first}, {Key: "$lte", Value: last}}}})
		if err != nil {
			return fmt.Errorf("migrate: count the buckets: %w", err)
		}
	}
	want := total - st.Skipped
	fmt.Fprintf(o.out, "check: source %d events (%d skipped as invalid), buckets hold %d events in the source's time range\n", total, st.Skipped, inBuckets)
	switch {
	case inBuckets < want:
		return fmt.Errorf("migrate: count mismatch: %d events in the buckets, %d expected; rerun to resume", inBuckets, want)
	case inBuckets > want:
		fmt.Fprintf(o.out, "note: %d more events than migrated in that range: written there by apps too\n", inBuckets-want)
	}
	fmt.Fprintln(o.out, "migration complete: counts match")
	return nil
}

// timeRange finds the first and last date of field tf in the source by
// sorted finds (FerretDB has no $min/$max accumulators).
func timeRange(ctx context.Context, src *mongo.Collection, tf string) (first, last bson.DateTime, ok bool, err error) {
	one := func(dir int) (bson.DateTime, bool, error) {
		var d bson.Raw
		err := src.FindOne(ctx, bson.D{{Key: tf, Value: bson.D{{Key: "$type", Value: "date"}}}},
			options.FindOne().SetSort(bson.D{{Key: tf, Value: dir}}).SetProjection(bson.D{{Key: tf, Value: 1}})).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("migrate: time range of the source: %w", err)
		}
		v, isDate := d.Lookup(tf).DateTimeOK()
		return bson.DateTime(v), isDate, nil
	}
	if first, ok, err = one(1); err != nil || !ok {
		return 0, 0, false, err
	}
	last, ok, err = one(-1)
	return first, last, ok, err
}
