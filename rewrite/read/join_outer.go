package read

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/join"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

// JoinOptions are what an aggregate on a plain collection that joins a
// bucketed namespace runs with.
type JoinOptions struct {
	// Bucketed reads a bucketed namespace (nil plan: a plain one).
	Bucketed join.Bucketed
	// IsBucketed says whether db.coll is a rule's namespace or buckets:
	// a last $out or $merge must not write there.
	IsBucketed func(db, coll string) bool
	// MaxMemory bounds the pipeline's blocking stages, joins and result.
	MaxMemory int
	// MaxUpdates bounds a $merge's update statements in one command.
	MaxUpdates int
}

// JoinAggregate plans an aggregate on db's plain collection whose
// $lookup, $graphLookup or $unionWith names a bucketed namespace: passed
// through, the upstream would join the app's empty collection of that
// name. The proxy runs the pipeline itself: its leading stages the
// upstream runs as they are ($match without $expr, $sort, $skip, $limit)
// go upstream in an aggregate on the collection, the rest runs in
// rewrite/join over what that returns, every join reading its namespace
// on the client's connection (a bucketed one through the proxy's read
// path). The answer is a cursor the proxy holds, or, for a last $out or
// $merge into a plain collection, its write.
func JoinAggregate(body []byte, db string, opts JoinOptions, newID func() int64) rewrite.Plan {
	j, err := readJoinAggregate(bsoncore.Document(body), db)
	if err != nil {
		return rewrite.Fail(err)
	}
	var output *agg.Output
	if n := len(j.rest); n > 0 && (j.rest[n-1].Name == "$out" || j.rest[n-1].Name == "$merge") {
		if output, err = agg.ReadOutput(j.rest[n-1].Name, j.rest[n-1].Value, db); err != nil {
			return rewrite.Fail(err)
		}
		if opts.IsBucketed != nil && opts.IsBucketed(output.DB, output.Coll) {
			return rewrite.Fail(mongoerr.Errorf(mongoerr.NotImplemented, "%s into %s.%s, a bucketed namespace, from an aggregate on %s is not supported", output.Stage, output.DB, output.Coll, j.ns))
		}
		j.rest = j.rest[:n-1]
	}
	p, err := join.Compile(j.rest, join.Env{DB: db, Reader: join.UpstreamReader(opts.Bucketed), MaxMemory: opts.MaxMemory})
	if err != nil {
		return rewrite.Fail(err)
	}
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		p.Bind(x)
		var failed error
		res, ok := x.Run(rewrite.DrainBatched(j.upstream, db, j.coll, 1000, func(docs []bsoncore.Document) error {
			for _, d := range docs {
				if err := p.Push(d); err != nil {
					failed = err
					return err
				}
			}
			return nil
		}, func() rewrite.Result { return rewrite.Result{Reply: rewrite.OKReply()} }))
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		if failed != nil {
			return rewrite.Result{}, failed
		}
		if !mongoerr.IsOK(res.Reply) {
			return rewrite.Result{Reply: res.Reply}, nil // the upstream's own answer (an authorization refusal)
		}
		docs, err := p.Finish()
		if err != nil {
			return rewrite.Result{}, err
		}
		if output != nil {
			reply, err := writeOutput(x, output, docs, j.ns, opts.MaxUpdates)
			return rewrite.Result{Reply: reply}, err
		}
		return point.HeldResult(docs, j.ns, j.batchSize, newID), nil
	})
}

// joinAggregate is an aggregate split into what the upstream runs first
// and what the proxy runs after.
type joinAggregate struct {
	coll, ns  string
	upstream  bsoncore.Document // the aggregate of the leading stages
	rest      []agg.Stage
	batchSize int64
}

func readJoinAggregate(body bsoncore.Document, db string) (*joinAggregate, error) {
	coll, ok := body.Lookup("aggregate").StringValueOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.NotImplemented, "a collectionless aggregate ({aggregate: 1}) that joins a bucketed namespace is not supported")
	}
	j := &joinAggregate{coll: coll, ns: db + "." + coll, batchSize: -1}
	elems, _ := body.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "aggregate", "pipeline", "cursor", "allowDiskUse", "$db", "lsid", "$clusterTime", "comment", "maxTimeMS", "$readPreference", "readConcern", "apiVersion", "apiStrict", "apiDeprecationErrors":
		case "explain":
			return nil, mongoerr.Errorf(mongoerr.NotImplemented, "explain of an aggregate on %s that joins a bucketed namespace is not supported", j.ns)
		default:
			return nil, mongoerr.Errorf(mongoerr.NotImplemented, "aggregate option %q on %s, whose pipeline joins a bucketed namespace, is not supported", e.Key(), j.ns)
		}
	}
	if cur, ok := body.Lookup("cursor").DocumentOK(); ok {
		if n, ok := bsonutil.WholeNumber(cur.Lookup("batchSize")); ok && n >= 0 {
			j.batchSize = n
		}
	} else {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument")
	}
	arr, ok := body.Lookup("pipeline").ArrayOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "'pipeline' option must be specified as an array")
	}
	vals, _ := arr.Values()
	var lead []bsoncore.Document
	for i, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "Each element of the 'pipeline' array must be an object")
		}
		st, err := d.IndexErr(0)
		if n, _ := d.Elements(); err != nil || len(n) != 1 {
			return nil, mongoerr.Errorf(mongoerr.Code(40323), "A pipeline stage specification object must contain exactly one field (stage %d)", i)
		}
		// The stage outlives the request's buffer in the compiled
		// pipeline's literals.
		stage := agg.Stage{Name: st.Key(), Value: bsoncore.Value{Type: st.Value().Type, Data: slices.Clone(st.Value().Data)}}
		if len(j.rest) == 0 && upstreamRuns(stage) {
			lead = append(lead, d)
			continue
		}
		j.rest = append(j.rest, stage)
	}
	pb := bsoncore.NewArrayBuilder()
	for _, d := range lead {
		pb.AppendDocument(d)
	}
	b := bsoncore.NewDocumentBuilder().AppendString("aggregate", coll).AppendArray("pipeline", pb.Build()).
		AppendDocument("cursor", bsoncore.NewDocumentBuilder().AppendInt32("batchSize", 1000).Build())
	for _, k := range []string{"allowDiskUse", "comment", "maxTimeMS", "readConcern"} {
		if v, err := body.LookupErr(k); err == nil {
			b.AppendValue(k, v)
		}
	}
	j.upstream = b.AppendString("$db", db).Build()
	return j, nil
}

// upstreamRuns says whether a leading stage goes upstream as it is:
// every upstream runs these as MongoDB does.
func upstreamRuns(st agg.Stage) bool {
	switch st.Name {
	case "$sort", "$skip", "$limit":
		return true
	case "$match":
		d, ok := st.Value.DocumentOK()
		if !ok {
			return false
		}
		for _, k := range []string{"$expr", "$where", "$function", "$jsonSchema"} {
			if _, err := d.LookupErr(k); err == nil {
				return false
			}
		}
		return true
	}
	return false
}
