package bucket

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TestSeriesUpdates: one upsert a series, widening its entry to the
// first and last window of its keys, in the order series first appear;
// the entry ids of two metas differ and hold no meta bytes.
func TestSeriesUpdates(t *testing.T) {
	a := KeyOf(bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "a")}, 7_200_000)
	b := KeyOf(bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "b")}, 0)
	a2, a3 := a, a
	a2.Start, a3.Start = 3_600_000, 10_800_000
	stmts := SeriesUpdates([]Key{a, b, a2, a3})
	if len(stmts) != 2 {
		t.Fatalf("%d statements, want one a series", len(stmts))
	}
	for i, want := range []struct {
		key         Key
		first, last int64
	}{{a, 3_600_000, 10_800_000}, {b, 0, 0}} {
		st := stmts[i]
		if id := st.Lookup("q", "_id").StringValue(); id != SeriesEntryID(want.key.Meta) {
			t.Errorf("statement %d names %q", i, id)
		}
		if f, l := st.Lookup("u", "$min", "first").DateTime(), st.Lookup("u", "$max", "last").DateTime(); f != want.first || l != want.last {
			t.Errorf("statement %d widens to [%d, %d], want [%d, %d]", i, f, l, want.first, want.last)
		}
		if up, _ := st.Lookup("upsert").BooleanOK(); !up {
			t.Errorf("statement %d is no upsert", i)
		}
	}
	if SeriesEntryID(a.Meta) == SeriesEntryID(b.Meta) || SeriesEntryID(nil) != SeriesEntryID([]byte{byte(bsoncore.TypeNull)}) {
		t.Error("entry ids: distinct metas share one, or no meta is not null's")
	}
}

// TestSeriesEntryRead: an entry's bounds read back; a marker vouches for
// the entries only with series: true (markers written before the
// entries existed do not); entries are told apart from bucket entries.
func TestSeriesEntryRead(t *testing.T) {
	nb := bsoncore.NewDocumentBuilder
	entry := nb().AppendString("_id", SeriesEntryID([]byte{2})).AppendDateTime("first", 10).AppendDateTime("last", 20).Build()
	if f, l, ok := SeriesBoundsOf(entry); !ok || f != 10 || l != 20 {
		t.Fatalf("bounds %d %d %v", f, l, ok)
	}
	if _, _, ok := SeriesBoundsOf(nb().AppendDateTime("first", 30).AppendDateTime("last", 20).Build()); ok {
		t.Error("an entry whose first is after its last reads")
	}
	if !IsSeriesEntry(entry) || IsSeriesEntry(IDIndexMarkerDoc(1)) {
		t.Error("IsSeriesEntry")
	}
	old := nb().AppendString("_id", IDIndexMarker).AppendInt64("v", 3).Build()
	if !SeriesComplete(IDIndexMarkerDoc(1)) || SeriesComplete(old) || SeriesComplete(entry) {
		t.Error("SeriesComplete")
	}
	if _, _, ok := NewIDSet(nil).MayHold(entry); ok {
		t.Error("a series entry is taken for a bucket's entry")
	}
}
