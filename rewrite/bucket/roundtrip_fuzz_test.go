package bucket_test

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/wire"
)

// FuzzInsertMergeRead drives generated events through the write and read
// paths as FerretDB serves them: an insert prepares them (or refuses
// them, with a message), they are staged, the staged document is read
// back and merged into a complete bucket, and the bucket is read back
// into events. Every document sent upstream (staged, merged) must be one
// FerretDB v1.24 stores (storableByFerretDB), and every event must read
// back as inserted, its meta's object fields sorted as MongoDB sorts
// them: an acknowledged event that a merge cannot store poisons its
// collection (issue 55, case 1).
func FuzzInsertMergeRead(f *testing.F) {
	for _, seed := range []bson.D{
		{{Key: "sensorId", Value: bson.D{{Key: "a.b", Value: 4}}}, {Key: "value", Value: 1.5}},
		{{Key: "sensorId", Value: bson.D{{Key: "b", Value: 1}, {Key: "a", Value: bson.D{{Key: "$x", Value: 1}, {Key: "", Value: 2}}}}}},
		{{Key: "sensorId", Value: bson.D{{Key: "a", Value: 1}, {Key: "a", Value: 2}}}, {Key: "x.y", Value: "z"}},
		{{Key: "sensorId", Value: bson.D{{Key: "\uE000", Value: bson.A{bson.D{{Key: "q", Value: 1}}}}}}, {Key: "$v", Value: math.Inf(1)}},
		{{Key: "sensorId", Value: math.NaN()}},
		{{Key: "value", Value: math.NaN()}, {Key: "n", Value: bson.A{bson.A{1}}}},
		{{Key: "sensorId", Value: "s"}, {Key: "value", Value: math.Inf(-1)}},
	} {
		b, err := bson.Marshal(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, int64(5))
	}
	rule := rwtest.InsertRule()
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		f.Fatal(err)
	}
	lim.Packed = true // FerretDB's buckets
	f.Fuzz(func(t *testing.T, data []byte, ms int64) {
		body := bsoncore.Document(data)
		if body.Validate() != nil || wire.ValidateDocument(data) != nil {
			return // the wire layer refuses it before an insert sees it
		}
		ev := eventWithTime(body, ms%(1<<40))
		evs, errs := bucket.PrepareEvents([]bsoncore.Document{ev}, true, rule, lim, func() bson.ObjectID { return rwtest.OID(1) })
		if len(errs) > 0 {
			if errs[0].Msg == "" {
				t.Fatalf("refused with no message: %+v", errs[0])
			}
			return // refused at insert, with a message: never acknowledged
		}
		for _, format := range []bucket.StagedFormat{bucket.StagedKeyed, bucket.StagedPacked} {
			staged := bucket.StagedDoc(rwtest.OID(9), [][]bucket.Event{evs}, bucket.StagedOptions{Format: format, Compress: true})
			if why := storableByFerretDB(staged); why != "" {
				t.Fatalf("staged document (format %d) not storable: %s", format, why)
			}
			back, err := bucket.StagedEvents(staged, rule, lim)
			if err != nil || len(back) != 1 {
				t.Fatalf("staged document reads back as %d events: %v", len(back), err)
			}
			merged := bucket.Complete(rwtest.OID(10), back, rule, lim)
			if why := storableByFerretDB(merged); why != "" {
				t.Fatalf("merged bucket not storable: %s", why)
			}
			read, err := bucket.StoredEvents(merged, rule, lim)
			if err != nil || len(read) != 1 {
				t.Fatalf("bucket reads back as %d events: %v", len(read), err)
			}
			meta, _, err := bucket.KeyFields(merged)
			if err != nil {
				t.Fatal(err)
			}
			got, err := bucket.RestoreMeta(read[0].Stored, rule.MetaField, func() (bsoncore.Value, error) { return meta, nil })
			if err != nil {
				t.Fatal(err)
			}
			if want := expectedReadBack(ev, rule.MetaField); !bytes.Equal(got, want) {
				t.Fatalf("event reads back as\n %s\nwant\n %s", bson.Raw(got), bson.Raw(want))
			}
		}
	})
}

// eventWithTime is body with ts (the rule's timeField) set to date ms,
// first, and an _id first of all when body has none (as the insert adds
// one).
func eventWithTime(body bsoncore.Document, ms int64) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	if _, err := body.LookupErr("_id"); err != nil {
		out = bsoncore.AppendObjectIDElement(out, "_id", rwtest.OID(1))
	}
	out = bsoncore.AppendDateTimeElement(out, "ts", ms)
	elems, _ := body.Elements()
	for _, e := range elems {
		if e.Key() != "ts" {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// expectedReadBack is ev with its meta's objects sorted by field name
// (stably), written independently of the code under test.
func expectedReadBack(ev bsoncore.Document, metaField string) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	elems, _ := ev.Elements()
	for _, e := range elems {
		if e.Key() == metaField {
			out = appendSorted(out, e.Key(), e.Value())
			continue
		}
		out = append(out, e...)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

func appendSorted(dst []byte, key string, v bsoncore.Value) []byte {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		elems, _ := bsoncore.Document(v.Data).Elements()
		elems = slices.Clone(elems)
		slices.SortStableFunc(elems, func(a, b bsoncore.Element) int { return strings.Compare(a.Key(), b.Key()) })
		idx, out := bsoncore.AppendDocumentElementStart(dst, key)
		for _, e := range elems {
			out = appendSorted(out, e.Key(), e.Value())
		}
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		return out
	case bsoncore.TypeArray:
		vals, _ := bsoncore.Array(v.Data).Values()
		idx, out := bsoncore.AppendArrayElementStart(dst, key)
		for i, x := range vals {
			out = appendSorted(out, strconv.Itoa(i), x)
		}
		out, _ = bsoncore.AppendArrayEnd(out, idx)
		return out
	}
	return bsoncore.AppendValueElement(dst, key, v)
}

// storableByFerretDB says why FerretDB v1.24 would refuse doc, or "":
// its document validation (names with '.', a leading '$', repeated or
// invalid UTF-8; infinities; an array in an array) and its wire check,
// which closes the connection on any NaN or Decimal128.
func storableByFerretDB(doc bsoncore.Document) string {
	return storableDoc(doc, 0)
}

func storableDoc(doc bsoncore.Document, depth int) string {
	if depth > 100 {
		return "nested too deep"
	}
	elems, err := doc.Elements()
	if err != nil {
		return err.Error()
	}
	seen := map[string]bool{}
	for _, e := range elems {
		k := e.Key()
		switch {
		case !utf8.ValidString(k), strings.HasPrefix(k, "$"), strings.Contains(k, "."), seen[k]:
			return fmt.Sprintf("name %q", k)
		}
		seen[k] = true
		if why := storableValue(e.Value(), false, depth); why != "" {
			return k + ": " + why
		}
	}
	return ""
}

func storableValue(v bsoncore.Value, inArray bool, depth int) string {
	switch v.Type {
	case bsoncore.TypeDouble:
		if f := v.Double(); math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Sprint(f)
		}
	case bsoncore.TypeDecimal128:
		return "Decimal128"
	case bsoncore.TypeEmbeddedDocument:
		return storableDoc(v.Data, depth+1)
	case bsoncore.TypeArray:
		if inArray {
			return "array in an array"
		}
		vals, _ := bsoncore.Array(v.Data).Values()
		for _, x := range vals {
			if x.Type == bsoncore.TypeEmbeddedDocument {
				if why := storableDoc(x.Data, depth+1); why != "" {
					return why
				}
				continue
			}
			if why := storableValue(x, true, depth+1); why != "" {
				return why
			}
		}
	}
	return ""
}
