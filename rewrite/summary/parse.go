package summary

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// SummaryPlan answers one aggregate from bucket summaries. The proxy sends
// Command, feeds every reply to Feed (sending the getMore it returns until
// nil) and then answers with Result; when Result says the summaries are not
// exact for the data found, the proxy plans the read with PlanRead instead.
type Aggregation struct {
	Command []byte

	rule      *rules.Rule
	span      int64
	group     summaryGroup
	after     []summaryStage
	buckets   []bucketSummary
	batchSize int64
}

// summaryKeyKind is what one part of the group _id is computed from.
type summaryKeyKind int

const (
	keyTrunc  summaryKeyKind = iota // $dateTrunc of the timeField
	keyMeta                         // "$<metaField>"
	keyNull                         // _id: null, one group
	keyBucket                       // $bucket by the timeField
)

type summaryKey struct {
	name  string // "" when the _id is this part alone
	kind  summaryKeyKind
	trunc dateTrunc
	bdoc  bucketRanges
}

// bucketRanges is a $bucket's boundaries (window edges, ascending) and
// its default _id (Type 0 when there is none).
type bucketRanges struct {
	edges []int64
	def   bsoncore.Value
}

type summaryAccKind int

const (
	accSum summaryAccKind = iota
	accCount
	accMin
	accMax
	accAvg
)

type summaryAcc struct {
	out   string
	kind  summaryAccKind
	field string        // accSum with a field, accAvg, accMin, accMax
	one   bsoncore.Type // accCount: the type of the constant 1 summed
}

type summaryGroup struct {
	keys []summaryKey
	accs []summaryAcc
}

// summaryStage is a $sort, $skip or $limit after the $group.
type summaryStage struct {
	name string
	sort []summarySortKey
	n    int64
}

type summarySortKey struct {
	path []string
	desc bool
}

// PlanSummary returns the plan that answers body from bucket summaries,
// or false when body is not an aggregate of a shape they answer exactly.
func PlanAggregation(body []byte, rule *rules.Rule, opts read.Options) (*Aggregation, bool) {
	if rule == nil || (rule.Layout != "" && rule.Layout != rules.LayoutEvents) || rule.SpanMillis() <= 0 {
		return nil, false
	}
	doc := bsoncore.Document(body)
	// Every read passes here: refuse other commands before validating.
	elems, err := doc.Elements()
	if err != nil || len(elems) == 0 || elems[0].Key() != "aggregate" {
		return nil, false
	}
	batchSize, ok := summaryOptions(elems[1:])
	if !ok {
		return nil, false
	}
	pv, _ := bsonutil.Lookup(doc, "pipeline")
	stages, ok := summaryStages(pv)
	if !ok || len(stages) == 0 {
		return nil, false
	}
	p := &Aggregation{rule: rule, span: rule.SpanMillis(), batchSize: batchSize}
	var filter bsoncore.Document
	if stages[0].Name == "$match" {
		d, ok := stages[0].Value.DocumentOK()
		if !ok {
			return nil, false
		}
		if filter, ok = p.bucketFilter(d); !ok {
			return nil, false
		}
		stages = stages[1:]
	}
	if len(stages) == 0 {
		return nil, false
	}
	switch stages[0].Name {
	case "$group":
		p.group, ok = p.parseGroup(stages[0].Value)
	case "$bucket":
		p.group, ok = p.parseBucket(stages[0].Value)
	default:
		ok = false
	}
	if !ok {
		return nil, false
	}
	if p.after, ok = p.parseAfter(stages[1:]); !ok {
		return nil, false
	}
	p.Command = p.findCommand(filter, bsonutil.Pick(doc, query.Carried))
	return p, true
}

// summaryOptions accepts the aggregate options that do not change the
// answer and returns the cursor batchSize (-1 when not given).
func summaryOptions(elems []bsoncore.Element) (int64, bool) {
	batchSize := int64(-1)
	sawCursor := false
	for _, e := range elems {
		switch k := e.Key(); {
		case k == "pipeline", query.CarriedSet[k]:
		case k == "allowDiskUse":
			if e.Value().Type != bsoncore.TypeBoolean {
				return 0, false
			}
		case k == "cursor":
			sawCursor = true
			cur, ok := e.Value().DocumentOK()
			if !ok {
				return 0, false
			}
			ce, _ := cur.Elements()
			for _, c := range ce {
				n, ok := bsonutil.WholeNumber(c.Value())
				if c.Key() != "batchSize" || !ok || n < 0 {
					return 0, false
				}
				batchSize = n
			}
		default: // explain, hint, collation, let...: PlanRead decides
			return 0, false
		}
	}
	return batchSize, sawCursor
}

func summaryStages(pv bsoncore.Value) ([]read.PipelineStage, bool) {
	arr, ok := pv.ArrayOK()
	if !ok {
		return nil, false
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, false
	}
	out := make([]read.PipelineStage, 0, len(vals))
	for _, v := range vals {
		e, ok := singleElem(v)
		if !ok {
			return nil, false
		}
		out = append(out, read.PipelineStage{Name: e.Key(), Value: e.Value(), Doc: v.Document()})
	}
	return out, true
}

// docElems returns the elements of v when it is a valid document with at
// least one.
func docElems(v bsoncore.Value) ([]bsoncore.Element, bool) {
	d, ok := v.DocumentOK()
	if !ok {
		return nil, false
	}
	elems, err := d.Elements()
	return elems, err == nil && len(elems) > 0
}

// singleElem returns the one element of v, a document of one key such as
// {$op: arg}.
func singleElem(v bsoncore.Value) (bsoncore.Element, bool) {
	elems, ok := docElems(v)
	if !ok || len(elems) != 1 {
		return nil, false
	}
	return elems[0], true
}
