package bucket_test

import (
	"bytes"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// A bucket built with Limits.Packed holds its events in FieldPacked, no
// events array, and the same summaries and events as the array form.
func TestCompletePacked(t *testing.T) {
	rule := rwtest.InsertRule()
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		t.Fatal(err)
	}
	var docs []bsoncore.Document
	for i := range 5 {
		docs = append(docs, rwtest.Doc(t, rwtest.Event(rwtest.OID(byte(i+1)), rwtest.DT(int64(i)*1000), "a", float64(i)+0.5)))
	}
	evs, errs := bucket.PrepareEvents(docs, true, rule, lim, bson.NewObjectID)
	if len(errs) > 0 {
		t.Fatalf("prepare: %v", errs)
	}
	id := rwtest.OID(9)
	arr := bucket.Complete(id, evs, rule, lim)
	lim.Packed = true
	packed := bucket.Complete(id, evs, rule, lim)
	if _, err := packed.LookupErr(bucket.FieldEvents); err == nil {
		t.Fatalf("packed bucket has an events array: %s", packed)
	}
	if _, err := packed.LookupErr(bucket.FieldPacked); err != nil {
		t.Fatalf("packed bucket without %q: %s", bucket.FieldPacked, packed)
	}
	for _, f := range []string{bucket.FieldMeta, bucket.FieldStart, bucket.FieldCount, bucket.FieldBytes, bucket.FieldMin, bucket.FieldMax, bucket.FieldSum} {
		if !packed.Lookup(f).Equal(arr.Lookup(f)) {
			t.Errorf("%s: packed %s, array %s", f, packed.Lookup(f), arr.Lookup(f))
		}
	}
	got, err := bucket.EventDocs(packed)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := bucket.EventDocs(arr)
	if len(got) != len(want) || len(got) != 5 {
		t.Fatalf("%d events packed, %d as an array, want 5", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("event %d: packed %s, array %s", i, got[i], want[i])
		}
	}
}

// A packed bucket that a $push later joined holds both fields: its events
// are the packed ones, then the pushed ones.
func TestEventValuesBothFields(t *testing.T) {
	ev := func(n int) bson.D { return bson.D{{Key: "_id", Value: n}, {Key: "ts", Value: rwtest.DT(int64(n))}} }
	_, packed, err := bson.MarshalValue(bson.A{ev(1), ev(2)})
	if err != nil {
		t.Fatal(err)
	}
	doc := rwtest.Doc(t, bson.D{{Key: "_id", Value: rwtest.OID(1)}, {Key: "count", Value: 3},
		{Key: "packed", Value: bson.Binary{Data: packed}}, {Key: "events", Value: bson.A{ev(3)}}})
	vals, err := bucket.EventValues(doc)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for _, v := range vals {
		ids = append(ids, v.Document().Lookup("_id").Int32())
	}
	if len(ids) != 3 || ids[0] != 1 || ids[1] != 2 || ids[2] != 3 {
		t.Fatalf("events %v, want [1 2 3]", ids)
	}
	shell := rwtest.Doc(t, bson.D{{Key: "_id", Value: rwtest.OID(1)}, {Key: "count", Value: 0}})
	if vals, err := bucket.EventValues(shell); err != nil || len(vals) != 0 {
		t.Fatalf("a bucket without events: %v %v", vals, err)
	}
	bad := rwtest.Doc(t, bson.D{{Key: "events", Value: "x"}})
	if _, err := bucket.EventValues(bad); err == nil {
		t.Fatal("events of a string accepted")
	}
}

// A staged document of several groups reads back into every group's
// events, each with its own series and window, in the order written, in
// either form; a single group is laid out as each form says.
func TestStagedGroupsRoundTrip(t *testing.T) {
	rule, lim, evs := preparedEvents(t, []any{"a", "a", "b", nil, "a"}, rwtest.Hour)
	var chunks [][]bucket.Event
	for _, g := range bucket.GroupEvents(evs) {
		chunks = append(chunks, bucket.ChunkEvents(g, lim)...)
	}
	if len(chunks) < 3 {
		t.Fatalf("%d chunks, want several", len(chunks))
	}
	id := rwtest.OID(9)
	var want []bucket.Event
	for _, c := range chunks {
		want = append(want, c...)
	}
	for _, tc := range []struct {
		format bucket.StagedFormat
		// fields of a staged document of one group and of several
		one, several string
	}{
		// As before groups were combined: {_id, meta, start, packed}.
		{bucket.StagedKeyed, "_id,meta,start,packed", "_id,meta,start,packed,more"},
		{bucket.StagedPacked, "_id,more", "_id,more"},
	} {
		opts := bucket.StagedOptions{Format: tc.format}
		if got := fieldNames(bucket.StagedDoc(id, chunks[:1], opts)); got != tc.one {
			t.Errorf("form %d: a staged document of one group has fields %s, want %s", tc.format, got, tc.one)
		}
		doc := bucket.StagedDoc(id, chunks, opts)
		if got := fieldNames(doc); got != tc.several {
			t.Errorf("form %d: a staged document of several groups has fields %s, want %s", tc.format, got, tc.several)
		}
		for _, d := range []struct {
			doc  bsoncore.Document
			want []bucket.Event
		}{{doc, want}, {bucket.StagedDoc(id, chunks[:1], opts), chunks[0]}} {
			got, err := bucket.StagedEvents(d.doc, rule, lim)
			if err != nil {
				t.Fatalf("form %d: %v", tc.format, err)
			}
			if len(got) != len(d.want) {
				t.Fatalf("form %d: %d events read back, want %d", tc.format, len(got), len(d.want))
			}
			for i := range got {
				if !bytes.Equal(got[i].Stored, d.want[i].Stored) || got[i].Start != d.want[i].Start || !got[i].Meta.Equal(d.want[i].Meta) || got[i].Time != d.want[i].Time {
					t.Errorf("form %d, event %d: got %s (%s, %d), want %s (%s, %d)", tc.format, i, got[i].Stored, got[i].Meta, got[i].Start, d.want[i].Stored, d.want[i].Meta, d.want[i].Start)
				}
			}
		}
	}
	emptyMore := bsoncore.NewArrayBuilder().Build()
	for name, bad := range map[string]bson.D{
		"a malformed more":                        {{Key: "_id", Value: id}, {Key: "meta", Value: "a"}, {Key: "start", Value: rwtest.DT(0)}, {Key: "more", Value: bson.Binary{Data: []byte{1, 2, 3}}}},
		"neither a group at the top nor more":     {{Key: "_id", Value: id}, {Key: "at", Value: int64(7)}},
		"more without groups, nothing at the top": {{Key: "_id", Value: id}, {Key: "more", Value: bson.Binary{Subtype: bucket.SubtypeArray, Data: emptyMore}}},
	} {
		evs, err := bucket.StagedEvents(rwtest.Doc(t, bad), rule, lim)
		t.Logf("%s: %v", name, err)
		if err == nil {
			t.Errorf("%s accepted: %d events", name, len(evs))
		}
	}
}

// fieldNames lists doc's field names, comma-separated.
func fieldNames(doc bsoncore.Document) string {
	elems, _ := doc.Elements()
	var keys []string
	for _, e := range elems {
		keys = append(keys, e.Key())
	}
	return strings.Join(keys, ",")
}

// With compression (Limits.Compress), a whole bucket and a staged
// document of several groups hold their events in compressed packed
// values, and read back to the same events as without.
func TestPackedCompressed(t *testing.T) {
	rule := rwtest.InsertRule()
	lim, err := bucket.LimitsOf(rule)
	if err != nil {
		t.Fatal(err)
	}
	if !lim.Compress {
		t.Fatal("a rule without bucket.compression does not compress")
	}
	var docs []bsoncore.Document
	for i := range 300 {
		docs = append(docs, rwtest.Doc(t, rwtest.Event(bson.NewObjectID(), rwtest.DT(int64(i/3)*1000), []string{"a", "b", "c"}[i%3], float64(i)/10)))
	}
	evs, errs := bucket.PrepareEvents(docs, true, rule, lim, bson.NewObjectID)
	if len(errs) > 0 {
		t.Fatalf("prepare: %v", errs)
	}
	groups := bucket.GroupEvents(evs)
	if len(groups) != 3 {
		t.Fatalf("%d groups, want 3", len(groups))
	}
	subtype := func(doc bsoncore.Document, field string) byte {
		st, _, ok := doc.Lookup(field).BinaryOK()
		if !ok {
			t.Fatalf("%q is not binary data: %s", field, doc.Lookup(field))
		}
		return st
	}

	lim.Packed = true
	whole := bucket.Complete(rwtest.OID(1), groups[0], rule, lim)
	if st := subtype(whole, bucket.FieldPacked); st != bucket.SubtypeZstdArray {
		t.Fatalf("bucket packed as subtype %#x", st)
	}
	lim.Compress = false
	raw := bucket.Complete(rwtest.OID(1), groups[0], rule, lim)
	if st := subtype(raw, bucket.FieldPacked); st != bucket.SubtypeArray {
		t.Fatalf("bucket with compression off packed as subtype %#x", st)
	}
	if len(whole)*2 > len(raw) {
		t.Errorf("compressed bucket %d bytes, raw %d", len(whole), len(raw))
	}
	got, err := bucket.EventDocs(whole)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := bucket.EventDocs(raw)
	if len(got) != 100 || len(got) != len(want) {
		t.Fatalf("%d events compressed, %d raw, want 100", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("event %d: compressed %s, raw %s", i, got[i], want[i])
		}
	}

	for _, format := range []bucket.StagedFormat{bucket.StagedKeyed, bucket.StagedPacked} {
		staged := bucket.StagedDoc(rwtest.OID(2), groups, bucket.StagedOptions{At: 7, Compress: true, Format: format})
		fields := []string{bucket.FieldPacked, bucket.FieldMore}
		if format == bucket.StagedPacked {
			fields = fields[1:]
		}
		for _, f := range fields {
			if st := subtype(staged, f); st != bucket.SubtypeZstdArray {
				t.Fatalf("form %d: staged %q packed as subtype %#x", format, f, st)
			}
		}
		back, err := bucket.StagedEvents(staged, rule, lim)
		if err != nil {
			t.Fatal(err)
		}
		if len(back) != len(evs) {
			t.Fatalf("form %d: %d staged events read back, want %d", format, len(back), len(evs))
		}
		i := 0
		for _, g := range groups {
			for _, ev := range g {
				if !bytes.Equal(back[i].Stored, ev.Stored) || back[i].Time != ev.Time || !back[i].Meta.Equal(ev.Meta) {
					t.Fatalf("form %d: staged event %d: got %s, want %s", format, i, back[i].Stored, ev.Stored)
				}
				i++
			}
		}
	}
}
