package read

import (
	"sort"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

// maxDistinctBytes bounds the values of a distinct, as the server's
// 16 MiB reply does.
const maxDistinctBytes = 16 << 20

// distinctDrain collects the distinct values of a path over the reshaped
// events: array values contribute their elements, missing values nothing,
// and values equal in BSON comparison (1 and 1.0) count once, the first
// seen kept. Values come out in BSON order, as the server's set gives.
type distinctDrain struct {
	path      []string
	metaField string
	metas     *point.MetaResolver
	values    []bsoncore.Value
	bytes     int
}

func (d *distinctDrain) feed(unwound bsoncore.Document) error {
	ev, err := point.ReshapeEvent(unwound, d.metaField, d.metas)
	if err != nil {
		return err
	}
	return d.addEvent(ev)
}

// pointDrain collects the distinct values of the events of a point read
// (whose events come with their meta restored).
func (d *distinctDrain) pointDrain() *PointDrain {
	return &PointDrain{take: d.addEvent, result: d.result}
}

// addEvent adds the values of an event (meta restored) at the path.
func (d *distinctDrain) addEvent(ev bsoncore.Document) error {
	var ferr error
	collectPath(bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: ev}, d.path, 0, func(v bsoncore.Value) {
		if ferr == nil {
			ferr = d.Add(v)
		}
	})
	return ferr
}

func (d *distinctDrain) Add(v bsoncore.Value) error {
	i := sort.Search(len(d.values), func(i int) bool { return bsonutil.Compare(d.values[i], v) >= 0 })
	if i < len(d.values) && bsonutil.Compare(d.values[i], v) == 0 {
		return nil
	}
	d.bytes += len(v.Data) + 8
	if d.bytes > maxDistinctBytes {
		return mongoerr.Errorf(mongoerr.DistinctTooBig, "distinct too big, 16mb cap")
	}
	v = bsoncore.Value{Type: v.Type, Data: append([]byte(nil), v.Data...)}
	d.values = append(d.values, bsoncore.Value{})
	copy(d.values[i+1:], d.values[i:])
	d.values[i] = v
	return nil
}

func (d *distinctDrain) result() bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	aidx, a := bsoncore.AppendArrayElementStart(out, "values")
	for i, v := range d.values {
		a = bsoncore.AppendValueElement(a, strconv.Itoa(i), v)
	}
	out, _ = bsoncore.AppendArrayEnd(a, aidx)
	out = bsoncore.AppendDoubleElement(out, "ok", 1)
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// collectPath emits the values at a dotted path as distinct sees them:
// arrays along the path are traversed (and a numeric component also
// indexes them); at the end of the path an array gives its elements.
func collectPath(v bsoncore.Value, path []string, depth int, emit func(bsoncore.Value)) {
	if depth > bsonutil.MaxDepth {
		return
	}
	if len(path) == 0 {
		if arr, ok := v.ArrayOK(); ok {
			vals, _ := arr.Values()
			for _, item := range vals {
				emit(item)
			}
			return
		}
		emit(v)
		return
	}
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		sub, err := bsoncore.Document(v.Data).LookupErr(path[0])
		if err == nil {
			collectPath(sub, path[1:], depth+1, emit)
		}
	case bsoncore.TypeArray:
		vals, _ := bsoncore.Array(v.Data).Values()
		if n, err := strconv.Atoi(path[0]); err == nil && n >= 0 {
			if n < len(vals) {
				collectPath(vals[n], path[1:], depth+1, emit)
			}
			return
		}
		for _, item := range vals {
			if item.Type == bsoncore.TypeEmbeddedDocument {
				collectPath(item, path, depth+1, emit)
			}
		}
	}
}
