package abilities

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/catalog"
	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/admin"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/hello"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Upstream is what the proxy learns about its upstream and shares
// across its connections: its limits (from hello), what it supports
// (caps.Detect on buildInfo, then probed where the version string says
// too little), and what a find by _id on a bucket collection costs. Each
// is learned once, on the first command that needs it.
type Upstream struct {
	pool     *exec.Pool // connections of the proxy's own, for its probes
	log      *slog.Logger
	indexIDs bool // the proxy indexes bucket _ids itself (the embedded upstream)

	mu     sync.Mutex
	limits hello.RouterHelloLimits
	caps   *caps.Upstream
	// idLookups: what a find by _id on a bucket collection costs (see
	// read.Options.IDLookups); nil until probed.
	idLookups *read.IDLookupCost
	// writeSlots bounds the bucket update commands running at once on an
	// upstream with Caps.MaxUpdateStatements (FerretDB).
	writeSlots chan struct{}
}

// New is what the proxy knows of its upstream before it asked: MongoDB's
// default limits, nothing more. pool gives the probes their connections;
// indexIDs says the proxy makes bucket lookups by _id indexed itself.
func New(pool *exec.Pool, log *slog.Logger, indexIDs bool) *Upstream {
	return &Upstream{pool: pool, log: log, indexIDs: indexIDs, limits: defaultLimits,
		writeSlots: make(chan struct{}, caps.FerretDBWriteSlots)}
}

// RememberHello keeps the limits of the upstream's hello reply r.
func (u *Upstream) RememberHello(r bson.Raw) {
	if !mongoerr.IsOK(r) {
		return
	}
	l := u.HelloLimits()
	set := func(dst *int32, key string) {
		if v, ok := r.Lookup(key).AsInt64OK(); ok {
			*dst = int32(v)
		}
	}
	set(&l.MinWireVersion, "minWireVersion")
	set(&l.MaxWireVersion, "maxWireVersion")
	set(&l.MaxBSONObjectSize, "maxBsonObjectSize")
	set(&l.MaxMessageSizeBytes, "maxMessageSizeBytes")
	set(&l.MaxWriteBatchSize, "maxWriteBatchSize")
	set(&l.LogicalSessionTimeoutMinutes, "logicalSessionTimeoutMinutes")
	u.mu.Lock()
	u.limits = l
	u.mu.Unlock()
}

// HelloLimits are the upstream's limits as its hello said them.
func (u *Upstream) HelloLimits() hello.RouterHelloLimits {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.limits
}

// Caps is what the upstream can do, detected once (buildInfo on up, then
// the probes) and then known for the proxy's life.
func (u *Upstream) Caps(up *upstream.Conn) (caps.Upstream, error) {
	st := u
	st.mu.Lock()
	if st.caps != nil {
		caps := *st.caps
		st.mu.Unlock()
		return caps, nil
	}
	st.mu.Unlock()
	reply, err := exec.RunDoc(up, bson.D{{Key: "buildInfo", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		return caps.Upstream{}, err
	}
	if r := upstream.RefusalOf(reply); r != nil {
		// Not cached: an error reply says nothing of what the upstream is.
		return caps.Upstream{}, fmt.Errorf("upstream capabilities: buildInfo: %w", r)
	}
	caps := caps.Detect(reply)
	u.sweepStaleProbes()
	if caps.StmtIDs && !u.probeRetryableWrites() {
		caps = caps.WithoutRetryableWrites()
	}
	if caps.FullAggregation && !u.probeExactSums() {
		caps.InexactSums = true
	}
	if !caps.UnusedIndexes && !u.probeIndexUse() {
		caps.UnusedIndexes = true
	}
	if !caps.CostlyUpdates && u.probeCostlyUpdates() {
		caps.CostlyUpdates = true
	}
	st.mu.Lock()
	st.caps = &caps
	st.mu.Unlock()
	u.log.Info("upstream capabilities detected", "caps", fmt.Sprintf("%+v", caps))
	return caps, nil
}

// probeName is the name of a new probe's scratch collection.
func probeName() string { return admin.ProbeName(time.Now(), catalog.NewNonce()) }

// sweepStaleProbes drops the probe collections that proxies killed or
// shut down mid-probe left behind (admin.StaleProbeSweep), before this
// one probes: an upstream several proxies restart on would otherwise
// gather them. A sweep that cannot run is logged, and the next proxy's
// takes them.
func (u *Upstream) sweepStaleProbes() {
	reply, err := u.drive(admin.StaleProbeSweep(rules.CatalogDB, time.Now()), nil)
	var n int
	if err == nil {
		n, err = admin.Dropped(reply)
	}
	switch {
	case err != nil:
		u.log.Warn("stale probe collections not swept", "err", err.Error())
	case n > 0:
		u.log.Info("dropped probe collections left by proxies stopped mid-probe", "db", rules.CatalogDB, "dropped", n)
	}
}

// probeRetryableWrites says whether the upstream keeps retryable writes
// with stmtIds (admin.RetryableWritesProbe): servers that claim MongoDB's
// version may not (FerretDB 2.x refuses stmtIds).
func (u *Upstream) probeRetryableWrites() bool {
	var lsid [16]byte
	_, _ = rand.Read(lsid[:])
	kept := u.probe("retryable writes", admin.RetryableWritesProbe(rules.CatalogDB, probeName(), lsid), admin.Retryable)
	if !kept {
		u.log.Info("the upstream does not keep retryable writes with stmtIds: the proxy keeps its own records of them")
	}
	return kept
}

// probeExactSums says whether the upstream's $group sums doubles as
// MongoDB does (admin.ExactSumsProbe); where it does not (DocumentDB),
// the proxy groups events itself rather than run unwound pipelines
// upstream.
func (u *Upstream) probeExactSums() bool {
	exact := u.probe("exact sums", admin.ExactSumsProbe(rules.CatalogDB, probeName()), admin.Exact)
	if !exact {
		u.log.Info("the upstream's $sum and $avg of doubles differ from MongoDB's: the proxy runs aggregations of events itself")
	}
	return exact
}

// probeIndexUse says whether the upstream's queries use a secondary
// index (admin.IndexUseProbe, by explain); where none does, the proxy
// makes no {meta: 1, start: 1} index of its own.
func (u *Upstream) probeIndexUse() bool {
	used := u.probe("index use", admin.IndexUseProbe(rules.CatalogDB, probeName()), admin.Used)
	if !used {
		u.log.Info("the upstream's queries use no secondary index: the proxy makes none of its own")
	}
	return used
}

// probeCostlyUpdates says whether an update of a bucket-sized document
// costs the upstream many inserts (admin.UpdateCostProbe): DocumentDB
// writes a new version of the whole document, as FerretDB v1.24 does,
// whatever its buildInfo says. There rules stage by default (ingest:
// auto) and small groups do not join full buckets. A probe that cannot
// run says no, as MongoDB's buildInfo would.
func (u *Upstream) probeCostlyUpdates() bool {
	clock := &stepClock{}
	cheap := u.probeWith("update cost", admin.UpdateCostProbe(rules.CatalogDB, probeName()),
		func(r exec.Runner) exec.Runner { clock.r = r; return clock },
		func(reply []byte) (bool, error) {
			if _, err := admin.Ran(reply); err != nil {
				return false, err
			}
			costly, update, insert := admin.UpdatesCostlyOf(clock.took)
			u.log.Info("update cost probed", "update", update, "insert", insert, "costly", costly)
			return !costly, nil
		})
	if !cheap {
		u.log.Info("the upstream rewrites a whole document on each update: rules stage their events by default")
	}
	return !cheap
}

// stepClock runs steps on r and keeps how long each took, for a probe
// that decides by time (the plan does no timing).
type stepClock struct {
	r    exec.Runner
	took []time.Duration
}

func (c *stepClock) RunStep(step rewrite.Step) ([][]byte, error) {
	start := time.Now()
	replies, err := c.r.RunStep(step)
	c.took = append(c.took, time.Since(start))
	return replies, err
}

// probe runs plan on a connection of the proxy's own and reads its
// answer. A probe that cannot run says yes, as the upstream's buildInfo
// does, and is logged.
func (u *Upstream) probe(what string, plan rewrite.Plan, read func([]byte) (bool, error)) bool {
	return u.probeWith(what, plan, nil, read)
}

// probeWith is probe with the runner the plan's steps go through made by
// wrap from the connection's (nil: as it is).
func (u *Upstream) probeWith(what string, plan rewrite.Plan, wrap func(exec.Runner) exec.Runner, read func([]byte) (bool, error)) bool {
	reply, err := u.drive(plan, wrap)
	if err != nil {
		u.log.Warn(what+" not probed; taken as MongoDB's", "err", err.Error())
		return true
	}
	yes, err := read(reply)
	if err != nil {
		u.log.Warn(what+" not probed; taken as MongoDB's", "err", err.Error())
		return true
	}
	return yes
}

// drive runs plan on a connection of the proxy's own, through the runner
// wrap makes of the connection's (nil: as it is), and returns its reply.
// A connection the plan failed on is discarded, not put back.
func (u *Upstream) drive(plan rewrite.Plan, wrap func(exec.Runner) exec.Runner) ([]byte, error) {
	up, err := u.pool.Take(context.Background())
	if err != nil {
		return nil, fmt.Errorf("no upstream connection: %w", err)
	}
	var r exec.Runner = exec.OnConn{Up: up}
	if wrap != nil {
		r = wrap(r)
	}
	res, err := exec.Drive(r, plan)
	if err != nil {
		u.pool.Discard(up)
		return nil, err
	}
	u.pool.Put(up)
	return res.Reply, nil
}

// probeIDLookup explains a find by _id on db.coll; false when the
// upstream gives no plan (no such collection) or refuses.
func probeIDLookup(up exec.Commander, db, coll string) (read.IDLookupCost, bool) {
	reply, err := exec.RunDoc(up, bson.D{
		{Key: "explain", Value: bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: bson.D{{Key: "_id", Value: bson.NilObjectID}}}}},
		{Key: "$db", Value: db},
	})
	if err != nil || upstream.RefusalOf(reply) != nil {
		return read.IDLookupIndexed, false
	}
	plan, _ := reply.Lookup("queryPlanner").DocumentOK()
	if elems, _ := plan.Elements(); len(elems) == 0 {
		return read.IDLookupIndexed, false
	}
	return lookupCostOf(plan), true
}

// lookupCostOf reads FerretDB's explain of a find by _id: SQLite's steps
// name a full scan "SCAN <table>" (and it parses each row's JSON),
// PostgreSQL's plan is a "Seq Scan" node (whose jsonb filter runs in
// storage).
func lookupCostOf(queryPlanner bson.Raw) read.IDLookupCost {
	switch plan := queryPlanner.Lookup("Plan"); plan.Type {
	case bson.TypeArray:
		vals, _ := plan.Array().Values()
		for _, v := range vals {
			if s, ok := v.StringValueOK(); ok && strings.Contains(s, "detail=SCAN ") {
				return read.IDLookupScansParsed
			}
		}
	case bson.TypeEmbeddedDocument:
		if node, _ := plan.Document().Lookup("Node Type").StringValueOK(); node == "Seq Scan" {
			return read.IDLookupScansFiltered
		}
	}
	return read.IDLookupIndexed
}

// routerLimits is what a synthetic hello says before any upstream hello
// was seen: MongoDB 7.0's values (what FerretDB 1.24 also reports).
var defaultLimits = hello.RouterHelloLimits{
	MinWireVersion: 0, MaxWireVersion: 21,
	MaxBSONObjectSize: 16 * 1024 * 1024, MaxMessageSizeBytes: 48_000_000,
	MaxWriteBatchSize: 100_000, LogicalSessionTimeoutMinutes: 30,
}

// IDLookupCost is what a find by _id on rule's bucket collection costs
// on up (a client's connection, or a merge's). What a lookup costs is the storage's, not the collection's:
// where the rule's bucket collection does not exist yet (a rule's first
// merge), FerretDB explains no plan, and the probe asks about the
// rule's lease collection, which a merging proxy has made. Without
// that, a new rule's first merge on the stock command looked each of
// its buckets up one by one, 172 lookups for 10,000 events of
// 1-minute slots (tsbench layouts).
func (u *Upstream) IDLookupCost(up exec.Commander, rule *rules.Rule, caps caps.Upstream) read.IDLookupCost {
	if !caps.IDOnlyFilters || u.indexIDs {
		return read.IDLookupIndexed
	}
	st := u
	st.mu.Lock()
	known := st.idLookups
	st.mu.Unlock()
	if known != nil {
		return *known
	}
	var cost read.IDLookupCost
	probed := false
	for _, coll := range []string{rule.BucketCollection, rules.LeaseCollection} {
		if cost, probed = probeIDLookup(up, rule.DB, coll); probed {
			break
		}
	}
	if !probed {
		return read.IDLookupIndexed // asked again on the next read or merge
	}
	st.mu.Lock()
	st.idLookups = &cost
	st.mu.Unlock()
	u.log.Info("upstream lookups by _id probed", "rule", rule.Namespace, "cost", int(cost))
	return cost
}

// Slot holds one of the upstream's write slots, where its updates hold
// them (caps.MaxUpdateStatements), until the func it returns is called.
func (u *Upstream) Slot() func() {
	u.writeSlots <- struct{}{}
	return func() { <-u.writeSlots }
}

// SlotsUpdates says whether the upstream's updates hold write slots.
func (u *Upstream) SlotsUpdates() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.caps != nil && u.caps.MaxUpdateStatements > 0
}
