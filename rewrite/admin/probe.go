package admin

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Servers that speak MongoDB's protocol claim MongoDB versions (FerretDB
// 2.x answers buildInfo as MongoDB 7.0), so what an upstream can do is
// found by trying it, never read from its version.

// ErrProbeUnauthorized: the proxy's credentials may not create the probe's
// collection, so the probe says nothing.
var ErrProbeUnauthorized = errors.New("tsproxy: the proxy's upstream credentials may not create a collection to probe the upstream")

// TimeseriesProbe is the plan that finds whether the upstream makes
// time-series collections of its own: it creates db.coll with the
// timeseries option, lists it and drops it. Its reply is {ok: 1, native:
// <bool>}, or {ok: 1, unauthorized: true} (Native reads it). The create's ok alone says nothing: FerretDB
// 2.x over DocumentDB accepts the option and makes a plain collection;
// only the listing's type "timeseries" does. coll should be a name of
// this probe's own (two proxies probing at once must not drop each
// other's).
func TimeseriesProbe(db, coll string) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		create := bsoncore.NewDocumentBuilder().AppendString("create", coll).
			AppendDocument("timeseries", bsoncore.NewDocumentBuilder().AppendString("timeField", "t").Build()).
			AppendString("$db", db).Build()
		reply, ok := x.One(create)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(reply); err != nil {
			if mongoerr.CodeOf(err) == mongoerr.Unauthorized {
				return flagResult("unauthorized", true), nil
			}
			// MongoDB before 5.0 and FerretDB v1.24 refuse the option.
			return flagResult("native", false), nil
		}
		list := bsoncore.NewDocumentBuilder().AppendInt32("listCollections", 1).
			AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendString("name", coll).Build()).
			AppendString("$db", db).Build()
		listed, ok := x.One(list)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		drop := bsoncore.NewDocumentBuilder().AppendString("drop", coll).AppendString("$db", db).Build()
		dropped, ok := x.One(drop)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(listed); err != nil {
			return rewrite.Result{}, fmt.Errorf("tsproxy: probing time-series collections: listCollections: %w", err)
		}
		if err := mongoerr.ReplyError(dropped); err != nil && mongoerr.CodeOf(err) != mongoerr.NamespaceNotFound {
			return rewrite.Result{}, fmt.Errorf("tsproxy: probing time-series collections: drop %s.%s: %w", db, coll, err)
		}
		return flagResult("native", listedType(listed) == "timeseries"), nil
	})
}

// listedType is the type of the first collection a listCollections reply
// lists ("" when none).
func listedType(reply []byte) string {
	batch, _ := bsoncore.Document(reply).Lookup("cursor", "firstBatch").ArrayOK()
	vals, _ := batch.Values()
	if len(vals) == 0 {
		return ""
	}
	d, _ := vals[0].DocumentOK()
	t, _ := d.Lookup("type").StringValueOK()
	return t
}

// Native reads a TimeseriesProbe's reply: whether the upstream made a
// time-series collection; an error reply is the probe's failure.
func Native(reply []byte) (bool, error) { return probeFlag(reply, "native") }

// RetryableWritesProbe is the plan that finds whether the upstream accepts
// stmtIds and keeps retryable writes: it inserts one document into db.coll
// twice under the same session (lsid, 16 bytes of the caller's) and
// txnNumber, counts the collection and drops it. A server that implements
// retryable writes answers the second insert with the first one's outcome
// and stores one document; FerretDB 2.x refuses stmtIds (UnknownBsonField),
// a MongoDB standalone refuses txnNumber. Its reply is {ok: 1, retryable:
// <bool>} (Retryable reads it), or {ok: 1, unauthorized: true}.
func RetryableWritesProbe(db, coll string, lsid [16]byte) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		insert := bsoncore.NewDocumentBuilder().AppendString("insert", coll).
			AppendArray("documents", bsoncore.NewArrayBuilder().AppendDocument(
				bsoncore.NewDocumentBuilder().AppendInt32("_id", 1).Build()).Build()).
			AppendArray("stmtIds", bsoncore.NewArrayBuilder().AppendInt32(0).Build()).
			AppendDocument("lsid", bsoncore.NewDocumentBuilder().AppendBinary("id", 4, lsid[:]).Build()).
			AppendInt64("txnNumber", 1).
			AppendString("$db", db).Build()
		first, ok := x.One(insert)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(first); err != nil {
			if mongoerr.CodeOf(err) == mongoerr.Unauthorized {
				return flagResult("unauthorized", true), nil
			}
			// Nothing was stored: no drop needed (a created collection
			// is empty and named for this probe only).
			return flagResult("retryable", false), nil
		}
		second, ok := x.One(insert)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		count := bsoncore.NewDocumentBuilder().AppendString("count", coll).AppendString("$db", db).Build()
		counted, ok := x.One(count)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		drop := bsoncore.NewDocumentBuilder().AppendString("drop", coll).AppendString("$db", db).Build()
		if _, ok := x.One(drop); !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(counted); err != nil {
			return rewrite.Result{}, fmt.Errorf("tsproxy: probing retryable writes: count: %w", err)
		}
		n, _ := bsoncore.Document(counted).Lookup("n").AsInt64OK()
		// The retry must be answered as the first attempt was (n: 1, no
		// duplicate key error), with one document stored.
		retried := mongoerr.ReplyError(second) == nil && !hasWriteErrors(second)
		return flagResult("retryable", retried && n == 1 && !hasWriteErrors(first)), nil
	})
}

func hasWriteErrors(reply []byte) bool {
	_, ok := bsoncore.Document(reply).Lookup("writeErrors").ArrayOK()
	return ok
}

func flagResult(key string, v bool) rewrite.Result {
	return rewrite.Result{Reply: bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).AppendBoolean(key, v).Build()}
}

// Retryable reads a RetryableWritesProbe's reply.
func Retryable(reply []byte) (bool, error) { return probeFlag(reply, "retryable") }

// probeFlag reads a probe's reply: its flag key, ErrProbeUnauthorized, or
// the error that stopped the probe.
func probeFlag(reply []byte, key string) (bool, error) {
	if err := mongoerr.ReplyError(reply); err != nil {
		return false, err
	}
	if u, _ := bsoncore.Document(reply).Lookup("unauthorized").BooleanOK(); u {
		return false, ErrProbeUnauthorized
	}
	v, _ := bsoncore.Document(reply).Lookup(key).BooleanOK()
	return v, nil
}

// ExactSumsProbe is the plan that finds whether the upstream's $group
// sums and averages doubles as MongoDB does, with compensated summation
// (0.1 + 0.2 + 0.3 is 0.6 to the last bit, and their $avg
// 0.19999999999999998): it inserts the three into db.coll, groups them
// and drops the collection. DocumentDB (FerretDB 2.x) sums naively
// (0.6000000000000001); where the sums differ the proxy groups the
// events itself rather than let the upstream run an unwound pipeline.
// Its reply is {ok: 1, exact: <bool>} (Exact reads it), or {ok: 1,
// unauthorized: true}.
func ExactSumsProbe(db, coll string) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		docs := bsoncore.NewArrayBuilder()
		for i, v := range []float64{0.1, 0.2, 0.3} {
			docs.AppendDocument(bsoncore.NewDocumentBuilder().AppendInt32("_id", int32(i)).AppendDouble("v", v).Build())
		}
		insert := bsoncore.NewDocumentBuilder().AppendString("insert", coll).
			AppendArray("documents", docs.Build()).AppendString("$db", db).Build()
		inserted, ok := x.One(insert)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(inserted); err != nil {
			if mongoerr.CodeOf(err) == mongoerr.Unauthorized {
				return flagResult("unauthorized", true), nil
			}
			return rewrite.Result{}, fmt.Errorf("tsproxy: probing sums: insert: %w", err)
		}
		group := bsoncore.NewDocumentBuilder().AppendString("aggregate", coll).
			AppendArray("pipeline", bsoncore.NewArrayBuilder().AppendDocument(
				bsoncore.NewDocumentBuilder().AppendDocument("$group", bsoncore.NewDocumentBuilder().
					AppendNull("_id").
					AppendDocument("s", bsoncore.NewDocumentBuilder().AppendString("$sum", "$v").Build()).
					AppendDocument("a", bsoncore.NewDocumentBuilder().AppendString("$avg", "$v").Build()).
					Build()).Build()).Build()).
			AppendDocument("cursor", bsoncore.NewDocumentBuilder().Build()).
			AppendString("$db", db).Build()
		grouped, ok := x.One(group)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		drop := bsoncore.NewDocumentBuilder().AppendString("drop", coll).AppendString("$db", db).Build()
		if _, ok := x.One(drop); !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(grouped); err != nil {
			// An upstream that cannot group runs no unwound $group either.
			return flagResult("exact", false), nil
		}
		batch, _ := bsoncore.Document(grouped).Lookup("cursor", "firstBatch").ArrayOK()
		vals, _ := batch.Values()
		if len(vals) != 1 {
			return flagResult("exact", false), nil
		}
		d, _ := vals[0].DocumentOK()
		s, sok := d.Lookup("s").DoubleOK()
		a, aok := d.Lookup("a").DoubleOK()
		return flagResult("exact", sok && aok && s == 0.6 && a == 0.19999999999999998), nil
	})
}

// Exact reads an ExactSumsProbe's reply.
func Exact(reply []byte) (bool, error) { return probeFlag(reply, "exact") }

// indexProbeName names the probe's index, so that its explain can be
// searched for it whatever shape the upstream's plan has.
const indexProbeName = "tsproxy_probe_idx"

// IndexUseProbe is the plan that finds whether the upstream's queries
// use a secondary index: it creates db.coll with an index on a, inserts
// three documents, explains a find by a and drops the collection. The
// index is used when the explain names it anywhere (MongoDB's IXSCAN
// stage has its indexName; DocumentDB's PostgreSQL plan its "Index
// Name"); FerretDB v1.24 explains a scan ("SCAN", "Seq Scan"). Where no
// index serves a read, the proxy makes none of its own
// (caps.UnusedIndexes). Its reply is {ok: 1, used: <bool>} (Used reads
// it), or {ok: 1, unauthorized: true}.
func IndexUseProbe(db, coll string) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		index := bsoncore.NewDocumentBuilder().AppendString("createIndexes", coll).
			AppendArray("indexes", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
				AppendDocument("key", bsoncore.NewDocumentBuilder().AppendInt32("a", 1).Build()).
				AppendString("name", indexProbeName).Build()).Build()).
			AppendString("$db", db).Build()
		made, ok := x.One(index)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		drop := bsoncore.NewDocumentBuilder().AppendString("drop", coll).AppendString("$db", db).Build()
		if err := mongoerr.ReplyError(made); err != nil {
			if mongoerr.CodeOf(err) == mongoerr.Unauthorized {
				return flagResult("unauthorized", true), nil
			}
			if _, ok := x.One(drop); !ok { // the create may have made the collection
				return rewrite.Result{}, rewrite.ErrAborted
			}
			return flagResult("used", false), nil
		}
		docs := bsoncore.NewArrayBuilder()
		for i := int32(1); i <= 3; i++ {
			docs.AppendDocument(bsoncore.NewDocumentBuilder().AppendInt32("_id", i).AppendInt32("a", i).Build())
		}
		insert := bsoncore.NewDocumentBuilder().AppendString("insert", coll).
			AppendArray("documents", docs.Build()).AppendString("$db", db).Build()
		if _, ok := x.One(insert); !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		explain := bsoncore.NewDocumentBuilder().AppendDocument("explain", bsoncore.NewDocumentBuilder().
			AppendString("find", coll).
			AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendInt32("a", 2).Build()).Build()).
			AppendString("verbosity", "queryPlanner").
			AppendString("$db", db).Build()
		explained, ok := x.One(explain)
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if _, ok := x.One(drop); !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if err := mongoerr.ReplyError(explained); err != nil {
			return flagResult("used", false), nil
		}
		plan, _ := bsoncore.Document(explained).Lookup("queryPlanner").DocumentOK()
		return flagResult("used", namesString(plan, indexProbeName, 0)), nil
	})
}

// namesString says whether doc holds the string s as a value, at any
// depth (arrays included).
func namesString(doc bsoncore.Document, s string, depth int) bool {
	if depth > 64 {
		return false
	}
	vals, err := doc.Values()
	if err != nil {
		return false
	}
	for _, v := range vals {
		switch v.Type {
		case bsoncore.TypeString:
			if str, _ := v.StringValueOK(); str == s {
				return true
			}
		case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
			if namesString(v.Data, s, depth+1) {
				return true
			}
		}
	}
	return false
}

// Used reads an IndexUseProbe's reply.
func Used(reply []byte) (bool, error) { return probeFlag(reply, "used") }

// The cost of an update. Joining open buckets (ingest: direct) is an
// update of a bucket per series and window an insert touches; where the
// upstream rewrites the whole document on each update (FerretDB v1.24's
// JSON; DocumentDB's PostgreSQL value, compressed out of line past 2 KB)
// that costs 2–10x staging the events (docs/how-it-works.md, "The write
// path on FerretDB 2.x"). UpdateCostProbe times an update command of
// costProbeStatements $push statements on one document of
// costProbeEvents elements, a bucket's size, against an insert command of
// as many small documents, costProbeRounds times each; UpdatesCostlyOf
// decides on the fastest of each. The plan sends the commands and the
// executor's runner times its steps: a plan does no timing.
const (
	costProbeEvents     = 1000
	costProbeStatements = 20
	costProbeRounds     = 3
	// costlyUpdateRatio: updates are costly when an update command takes
	// more than this many times an insert command. DocumentDB measured
	// 15–20x, FerretDB v1.24 more; MongoDB modifies a document in place.
	costlyUpdateRatio = 6
)

// UpdateCostProbe is the plan of the update-cost probe on db.coll, one
// command a step: the setup's insert, then each round's update and
// insert, then the drop (UpdatesCostlyOf reads the steps' times in that
// order). Its reply is {ok: 1, ran: true} (Ran reads it), or {ok: 1,
// unauthorized: true}.
func UpdateCostProbe(db, coll string) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		drop := bsoncore.NewDocumentBuilder().AppendString("drop", coll).AppendString("$db", db).Build()
		failed := func(reply []byte) (rewrite.Result, error) {
			if mongoerr.CodeOf(mongoerr.ReplyError(reply)) == mongoerr.Unauthorized {
				return flagResult("unauthorized", true), nil
			}
			if _, ok := x.One(drop); !ok {
				return rewrite.Result{}, rewrite.ErrAborted
			}
			return rewrite.Result{}, mongoerr.ReplyError(reply)
		}
		cmds := [][]byte{costProbeSetup(db, coll)}
		for round := range costProbeRounds {
			cmds = append(cmds, costProbeUpdate(db, coll), costProbeInsert(db, coll, round))
		}
		for _, cmd := range cmds {
			reply, ok := x.One(cmd)
			if !ok {
				return rewrite.Result{}, rewrite.ErrAborted
			}
			if mongoerr.ReplyError(reply) != nil {
				return failed(reply)
			}
		}
		if _, ok := x.One(drop); !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		return flagResult("ran", true), nil
	})
}

// Ran reads an UpdateCostProbe's reply.
func Ran(reply []byte) (bool, error) { return probeFlag(reply, "ran") }

// UpdatesCostlyOf decides from the times of an UpdateCostProbe's steps,
// in its order (setup, then update and insert per round, then drop);
// fewer steps than that decide nothing. It returns the fastest update and
// insert it compared.
func UpdatesCostlyOf(steps []time.Duration) (costly bool, update, insert time.Duration) {
	if len(steps) < 1+2*costProbeRounds {
		return false, 0, 0
	}
	var updates, inserts []time.Duration
	for round := range costProbeRounds {
		updates = append(updates, steps[1+2*round])
		inserts = append(inserts, steps[2+2*round])
	}
	return updatesCostly(updates, inserts), slices.Min(updates), slices.Min(inserts)
}

// costProbeSetup inserts the probe's document into db.coll: {_id: 0, e:
// [{t, v}, ...]} of costProbeEvents elements.
func costProbeSetup(db, coll string) []byte {
	e := bsoncore.NewArrayBuilder()
	for i := int32(0); i < costProbeEvents; i++ {
		e.AppendDocument(bsoncore.NewDocumentBuilder().AppendInt32("t", i).AppendDouble("v", float64(i)*1.5).Build())
	}
	doc := bsoncore.NewDocumentBuilder().AppendInt32("_id", 0).AppendArray("e", e.Build()).Build()
	return bsoncore.NewDocumentBuilder().AppendString("insert", coll).
		AppendArray("documents", bsoncore.NewArrayBuilder().AppendDocument(doc).Build()).
		AppendString("$db", db).Build()
}

// costProbeUpdate is the timed update: costProbeStatements $push
// statements on the setup's document.
func costProbeUpdate(db, coll string) []byte {
	stmts := bsoncore.NewArrayBuilder()
	for i := int32(0); i < costProbeStatements; i++ {
		stmts.AppendDocument(bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendInt32("_id", 0).Build()).
			AppendDocument("u", bsoncore.NewDocumentBuilder().AppendDocument("$push", bsoncore.NewDocumentBuilder().
				AppendDocument("e", bsoncore.NewDocumentBuilder().AppendInt32("t", -i).AppendDouble("v", 0.5).Build()).Build()).Build()).
			Build())
	}
	return bsoncore.NewDocumentBuilder().AppendString("update", coll).AppendArray("updates", stmts.Build()).
		AppendBoolean("ordered", true).AppendString("$db", db).Build()
}

// costProbeInsert is round's timed insert: costProbeStatements small
// documents, of _ids no other round uses.
func costProbeInsert(db, coll string, round int) []byte {
	docs := bsoncore.NewArrayBuilder()
	for i := 0; i < costProbeStatements; i++ {
		docs.AppendDocument(bsoncore.NewDocumentBuilder().AppendInt64("_id", int64(round*costProbeStatements+i+1)).
			AppendInt32("t", int32(i)).AppendDouble("v", 0.5).Build())
	}
	return bsoncore.NewDocumentBuilder().AppendString("insert", coll).AppendArray("documents", docs.Build()).
		AppendBoolean("ordered", true).AppendString("$db", db).Build()
}

// updatesCostly is the decision: the fastest update command against the
// fastest insert command (the least disturbed by other work on the
// machine).
func updatesCostly(updates, inserts []time.Duration) bool {
	if len(updates) == 0 || len(inserts) == 0 {
		return false
	}
	return slices.Min(updates) > costlyUpdateRatio*slices.Min(inserts)
}
