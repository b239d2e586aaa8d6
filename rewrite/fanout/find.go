package fanout

import (
	"slices"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MaxPartitionedReadBytes bounds what a find across partitions collects
// before answering: the partitions' results are held by the proxy.
const MaxPartitionedReadBytes = 64 << 20

// PartitionedFind is a find across partitions.
type FindMerge struct {
	// Sub is the find each partition runs: the client's, without skip,
	// limit, batchSize, singleBatch and projection, and limit = skip +
	// limit when limited.
	Sub []byte

	ns     string
	sort   []mergeKey
	proj   *query.Projection
	skip   int64
	limit  int64
	single bool
	first  int64 // first batch size, -1 for as many as fit
	out    []bsoncore.Document
	bytes  int
	begun  bool
}

type mergeKey struct {
	path []string
	desc bool
}

// PlanPartitionedFind plans a find across partitions.
func PlanFindMerge(body []byte, rule *rules.Rule) (*FindMerge, error) {
	rc, err := query.NewCtx(rule)
	if err != nil {
		return nil, err
	}
	doc := bsoncore.Document(body)
	pg, err := rc.ReadFindPaging(doc)
	if err != nil {
		return nil, err
	}
	f := &FindMerge{ns: rc.NS, skip: pg.Skip, limit: pg.Limit, single: pg.Single, first: pg.FirstBatch()}
	projDoc, err := rc.ReadDoc(doc, "projection", "find")
	if err != nil {
		return nil, err
	}
	if f.proj, err = rc.ParseProjection(projDoc, "find option \"projection\""); err != nil {
		return nil, err
	}
	sortDoc, err := rc.ReadDoc(doc, "sort", "find")
	if err != nil {
		return nil, err
	}
	if f.sort, err = parseMergeSort(rc, sortDoc); err != nil {
		return nil, err
	}
	idx, sub := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	for _, e := range elems {
		switch e.Key() {
		case "skip", "limit", "batchSize", "singleBatch", "projection":
		default:
			sub = append(sub, e...)
		}
	}
	if f.limit > 0 {
		sub = bsoncore.AppendInt64Element(sub, "limit", f.skip+f.limit)
	}
	f.Sub, _ = bsoncore.AppendDocumentEnd(sub, idx)
	return f, nil
}

// parseMergeSort reads the sort the proxy merges by: fields ascending or
// descending; other sort specs are refused across partitions.
func parseMergeSort(rc *query.Ctx, sortDoc bsoncore.Document) ([]mergeKey, error) {
	if sortDoc == nil {
		return nil, nil
	}
	elems, err := sortDoc.Elements()
	if err != nil {
		return nil, rc.BadValue(mongoerr.BadValue, "find option \"sort\" is not valid BSON")
	}
	var keys []mergeKey
	for _, e := range elems {
		n, ok := e.Value().AsInt64OK()
		if !ok {
			if fl, isF := e.Value().DoubleOK(); isF {
				n, ok = int64(fl), fl == 1 || fl == -1
			}
		}
		if !ok || (n != 1 && n != -1) {
			return nil, rc.Unsupported("sort %q: only 1 and -1 are supported on a read spanning partitions", e.Key())
		}
		keys = append(keys, mergeKey{path: strings.Split(e.Key(), "."), desc: n < 0})
	}
	return keys, nil
}

// Add collects the documents of one partition, in partition time order;
// it fails when the whole read would exceed MaxPartitionedReadBytes.
func (f *FindMerge) Add(docs []bsoncore.Document) error {
	for _, d := range docs {
		f.bytes += len(d)
		if f.bytes > MaxPartitionedReadBytes {
			return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy %s: the find spans several partitions and returns more than %d MiB, which the proxy would hold; bound it in time (within one partition) or add a limit", f.ns, MaxPartitionedReadBytes>>20)
		}
		f.out = append(f.out, slices.Clone(d))
	}
	return nil
}

// Finish merges what was added by the sort (stable, so ties keep
// partition order), then skips, limits and projects.
func (f *FindMerge) Finish() error {
	if len(f.sort) > 0 {
		var bad error
		slices.SortStableFunc(f.out, func(a, b bsoncore.Document) int {
			c, err := f.compare(a, b)
			if err != nil && bad == nil {
				bad = err
			}
			return c
		})
		if bad != nil {
			return bad
		}
	}
	if f.skip >= int64(len(f.out)) {
		f.out = nil
	} else {
		f.out = f.out[f.skip:]
	}
	if f.limit > 0 && int64(len(f.out)) > f.limit {
		f.out = f.out[:f.limit]
	}
	if f.proj != nil {
		for i, d := range f.out {
			p, err := f.proj.Apply(d)
			if err != nil {
				return err
			}
			f.out[i] = p
		}
	}
	return nil
}

func (f *FindMerge) compare(a, b bsoncore.Document) (int, error) {
	for _, k := range f.sort {
		va, err := f.sortValue(a, k.path)
		if err != nil {
			return 0, err
		}
		vb, err := f.sortValue(b, k.path)
		if err != nil {
			return 0, err
		}
		c := bsonutil.Compare(va, vb)
		if k.desc {
			c = -c
		}
		if c != 0 {
			return c, nil
		}
	}
	return 0, nil
}

// sortValue is the value a sort compares: null when missing; an array on
// the path is refused (its sort key is an element, chosen by direction).
func (f *FindMerge) sortValue(d bsoncore.Document, path []string) (bsoncore.Value, error) {
	null := bsoncore.Value{Type: bsoncore.TypeNull}
	cur := d
	for i, p := range path {
		v, err := cur.LookupErr(p)
		if err != nil {
			return null, nil
		}
		if v.Type == bsoncore.TypeArray {
			return null, mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy %s: sort on %q meets an array, which a read spanning partitions cannot merge", f.ns, strings.Join(path, "."))
		}
		if i == len(path)-1 {
			return v, nil
		}
		sub, ok := v.DocumentOK()
		if !ok {
			return null, nil
		}
		cur = sub
	}
	return null, nil
}

// Batch answers the next batch of the merged cursor (first batch on the
// first call); want < 0 takes as many as fit. more is false when the
// cursor is done (id is then answered as 0).
func (f *FindMerge) Batch(id, want int64) (reply []byte, more bool) {
	key := "nextBatch"
	if !f.begun {
		key, want = "firstBatch", f.first
	}
	f.begun = true
	n, _ := cursor.BatchLen(f.out, want)
	batch := f.out[:n]
	f.out = f.out[n:]
	more = !f.single && len(f.out) > 0
	if !more {
		id = 0
	}
	d := cursor.Reply{Key: key, Batch: batch, NS: f.ns}.WithID(id)
	return d, more
}

// TimeLed reports the direction of a sort led by the timeField with a
// limit: the partitions are then read in that time order (desc: newest
// first) until Enough says the rest cannot reach the result.
func (f *FindMerge) TimeLed(rule *rules.Rule) (led, desc bool) {
	if f.limit <= 0 || len(f.sort) == 0 || len(f.sort[0].path) != 1 || f.sort[0].path[0] != rule.TimeField {
		return false, false
	}
	return true, f.sort[0].desc
}

// Enough reports, for a TimeLed find, whether the partitions not read yet
// cannot change the result: their events all have times at or after
// bound (ascending: the next partition's start) or before it
// (descending: the end of the next partition's last window), and the
// skip+limit-th document read so far sorts strictly before them.
func (f *FindMerge) Enough(rule *rules.Rule, bound int64) bool {
	k := f.skip + f.limit
	if int64(len(f.out)) < k {
		return false
	}
	sorted := slices.Clone(f.out)
	var bad error
	slices.SortStableFunc(sorted, func(a, b bsoncore.Document) int {
		c, err := f.compare(a, b)
		if err != nil && bad == nil {
			bad = err
		}
		return c
	})
	if bad != nil {
		return false // Finish reports it
	}
	v, err := sorted[k-1].LookupErr(rule.TimeField)
	if err != nil {
		return false
	}
	ms, ok := v.DateTimeOK()
	if !ok {
		return false
	}
	if f.sort[0].desc {
		return ms >= bound
	}
	return ms < bound
}
