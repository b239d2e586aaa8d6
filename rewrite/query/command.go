package query

import (
	"math"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Carried are the generic arguments a rewritten read carries.
var Carried = []string{
	"maxTimeMS", "comment", "readConcern",
	"lsid", "txnNumber", "autocommit", "startTransaction",
	"$readPreference", "$clusterTime",
	"apiVersion", "apiStrict", "apiDeprecationErrors",
}

var CarriedSet = func() map[string]bool {
	m := map[string]bool{"$db": true}
	for _, k := range Carried {
		m[k] = true
	}
	return m
}()

// refusedReadOptions explains why an option has no bucketed equivalent.
var refusedReadOptions = map[string]string{
	"collation":           "comparisons run on the bucket collection without it",
	"min":                 "index bounds name the bucket collection's indexes",
	"max":                 "index bounds name the bucket collection's indexes",
	"returnKey":           "index keys are the bucket collection's",
	"showRecordId":        "record ids are the buckets'",
	"tailable":            "bucketed reads are not tailable",
	"awaitData":           "bucketed reads are not tailable",
	"oplogReplay":         "not an oplog",
	"let":                 "variables are not supported",
	"allowPartialResults": "not supported",
	"noCursorTimeout":     "not supported",
	"writeConcern":        "reads through the proxy do not write",
}

// boolFalseOK: options that are harmless when false.
var boolFalseOK = map[string]bool{"tailable": true, "awaitData": true, "allowPartialResults": true, "noCursorTimeout": true, "returnKey": true, "showRecordId": true, "oplogReplay": true}

// Paging is a find's skip, limit, singleBatch and batchSize, read and
// checked as MongoDB does; a negative limit asks for one batch of -limit.
type Paging struct {
	Skip, Limit int64
	Single      bool
	BatchSize   int64 // -1 when the command gives none
}

// firstBatch is how many documents the first batch of a cursor the proxy
// holds carries: the batchSize or the server's default, at most the limit.
func (pg Paging) FirstBatch() int64 {
	first := int64(DefaultFirstBatch)
	if pg.BatchSize >= 0 {
		first = pg.BatchSize
	}
	if pg.Limit > 0 && (pg.Single || first > pg.Limit) {
		first = pg.Limit
	}
	return first
}

// UnwindStages unwind a bucket's events upstream. Where the proxy does
// not pack events (an upstream that runs any stage: MongoDB), a bucket
// with packed events can only have been copied from a FerretDB (a dump
// restored), and $unwind would skip its events: a wrong answer. A guard
// first fails the pipeline on such a bucket, naming the remedy (tsproxy
// unpack); it leaves every other bucket as it is.
func UnwindStages(c caps.Upstream) []bsoncore.Document {
	unwind := bsonutil.Stage("$unwind", bsonutil.StringValue("$"+bucket.FieldEvents))
	if !c.FullAggregation || c.PackedEvents {
		return []bsoncore.Document{unwind}
	}
	return []bsoncore.Document{packedGuard, unwind}
}

// packedGuard is built once: every event read on MongoDB carries it, and
// a stage is only ever copied into a command, never changed.
var packedGuard = packedGuardStage()

// PackedEventsRefusal is the text of the guard's error, inside the
// upstream's conversion error.
const PackedEventsRefusal = "tsproxy: packed events (a bucket copied from FerretDB) cannot be unwound here; run tsproxy unpack on the rule. packed: "

// packedGuardStage is {$addFields: {packed: {$cond: [<no packed field>,
// "$$REMOVE", <an error unless there is none>]}}}: the error is a failed conversion of a
// string that names the problem, made of the field's type so that it is
// never folded into a constant (an error at parse time would fail every
// read).
func packedGuardStage() bsoncore.Document {
	typ := bsoncore.NewDocumentBuilder().AppendString("$type", "$"+bucket.FieldPacked).Build()
	missing := bsoncore.NewDocumentBuilder().AppendArray("$eq", bsoncore.NewArrayBuilder().AppendDocument(typ).AppendString("missing").Build()).Build()
	msg := bsoncore.NewDocumentBuilder().AppendArray("$concat", bsoncore.NewArrayBuilder().
		AppendDocument(bsoncore.NewDocumentBuilder().AppendString("$literal", PackedEventsRefusal).Build()).
		AppendDocument(typ).Build()).Build()
	// The conversion's input is a number's text unless the field is
	// there: DocumentDB evaluates both branches of a $cond, and a guard
	// that failed on its own failed every read there.
	failInput := bsoncore.NewDocumentBuilder().AppendArray("$cond", bsoncore.NewArrayBuilder().
		AppendDocument(missing).AppendString("0").AppendDocument(msg).Build()).Build()
	fail := bsoncore.NewDocumentBuilder().AppendDocument("$toInt", failInput).Build()
	cond := bsoncore.NewDocumentBuilder().AppendArray("$cond", bsoncore.NewArrayBuilder().
		AppendDocument(missing).AppendString("$$REMOVE").AppendDocument(fail).Build()).Build()
	fields := bsoncore.NewDocumentBuilder().AppendDocument(bucket.FieldPacked, cond).Build()
	return bsonutil.Stage("$addFields", bsonutil.DocValue(fields))
}

// EventPipeline is the upstream pipeline of an event read, before its
// tail: bucket $match, $unwind (UnwindStages), event $match.
func EventPipeline(sf SplitFilter, c caps.Upstream) []bsoncore.Document {
	var st []bsoncore.Document
	if sf.Bucket != nil {
		st = append(st, bsonutil.Stage("$match", bsonutil.DocValue(sf.Bucket)))
	}
	st = append(st, UnwindStages(c)...)
	if sf.Event != nil {
		st = append(st, bsonutil.Stage("$match", bsonutil.DocValue(sf.Event)))
	}
	return st
}

func GetMoreCommand(rc *Ctx, id int64) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt64Element(d, "getMore", id)
	d = bsoncore.AppendStringElement(d, "collection", rc.Rule.BucketCollection)
	d = bsoncore.AppendStringElement(d, "$db", rc.Rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// AppendCount writes a count as the server does: an int32 when it fits.
func AppendCount(dst []byte, key string, n int64) []byte {
	if n >= math.MinInt32 && n <= math.MaxInt32 {
		return bsoncore.AppendInt32Element(dst, key, int32(n))
	}
	return bsoncore.AppendInt64Element(dst, key, n)
}

// GetMore rewrites a getMore of a cursor a rewritten read opened: the
// collection becomes the bucket collection.
func GetMore(body []byte, rule *rules.Rule) ([]byte, error) {
	return RenameTarget(body, rule, "getMore", "collection")
}

// KillCursors rewrites killCursors on the app's namespace to the bucket
// collection and returns the cursor ids it names.
func KillCursors(body []byte, rule *rules.Rule) ([]byte, []int64, error) {
	out, err := RenameTarget(body, rule, "killCursors", "killCursors")
	if err != nil {
		return nil, nil, err
	}
	var ids []int64
	if v, err := bsoncore.Document(body).LookupErr("cursors"); err == nil {
		if arr, ok := v.ArrayOK(); ok {
			vals, _ := arr.Values()
			for _, v := range vals {
				if id, ok := v.AsInt64OK(); ok {
					ids = append(ids, id)
				}
			}
		}
	}
	return out, ids, nil
}

// KillCursorsCommand kills one upstream cursor of the bucket collection.
func KillCursorsCommand(rule *rules.Rule, id int64) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "killCursors", rule.BucketCollection)
	aidx, a := bsoncore.AppendArrayElementStart(d, "cursors")
	a = bsoncore.AppendInt64Element(a, "0", id)
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d = bsoncore.AppendStringElement(d, "$db", rule.DB)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// RenameTarget copies body with the string field key set to the bucket
// collection.
func RenameTarget(body []byte, rule *rules.Rule, cmd, key string) ([]byte, error) {
	rc, err := NewCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	if err := doc.Validate(); err != nil {
		return nil, rc.BadValue(mongoerr.InvalidBSON, "%s is not valid BSON: %v", cmd, err)
	}
	elems, _ := doc.Elements()
	if len(elems) == 0 || elems[0].Key() != cmd {
		return nil, rc.BadValue(mongoerr.BadValue, "not a %s command", cmd)
	}
	found := false
	idx, d := bsoncore.AppendDocumentStart(make([]byte, 0, len(body)+16))
	for _, e := range elems {
		if e.Key() == key && !found {
			if _, ok := e.Value().StringValueOK(); !ok {
				return nil, rc.BadValue(mongoerr.TypeMismatch, "%s field %q must be a string", cmd, key)
			}
			found = true
			d = bsoncore.AppendStringElement(d, key, rule.BucketCollection)
			continue
		}
		d = append(d, e...)
	}
	if !found {
		return nil, rc.BadValue(mongoerr.FailedToParse, "%s needs %q", cmd, key)
	}
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d, nil
}

const (
	// MaxBatchBytes bounds a reply's batch below the 16 MiB message size
	// (as MongoDB does).
	MaxBatchBytes = 16*1024*1024 - 64*1024
	// DefaultFirstBatch is MongoDB's default first batch size.
	DefaultFirstBatch = 101
)
