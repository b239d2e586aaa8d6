package bucket

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// eventsWithIDs are stored events whose _ids are ids.
func eventsWithIDs(ids ...bsoncore.Value) []Event {
	evs := make([]Event, len(ids))
	for i, id := range ids {
		b := bsoncore.NewDocumentBuilder()
		if id.Type != 0 {
			b.AppendValue("_id", id)
		}
		evs[i] = Event{Stored: b.AppendDouble("v", float64(i)).Build()}
	}
	return evs
}

func oidValue(id bson.ObjectID) bsoncore.Value {
	return bsoncore.Value{Type: bsoncore.TypeObjectID, Data: id[:]}
}

func TestIDIndexMayHold(t *testing.T) {
	oids := make([]bsoncore.Value, 1000)
	for i := range oids {
		oids[i] = oidValue(bson.NewObjectID())
	}
	bid := bson.NewObjectID()
	oidEntry := IDIndexEntry(bid, 0, eventsWithIDs(oids...))
	mixedEntry := IDIndexEntry(bid, 0, eventsWithIDs(
		bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "a")},
		bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, 5)},
		bsoncore.Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, 2.5)},
	))
	docEntry := IDIndexEntry(bid, 0, eventsWithIDs(
		bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: bsoncore.NewDocumentBuilder().AppendInt32("k", 1).Build()},
	))
	missingEntry := IDIndexEntry(bid, 0, eventsWithIDs(bsoncore.Value{}))
	str := func(s string) bsoncore.Value {
		return bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, s)}
	}
	i64 := func(n int64) bsoncore.Value {
		return bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, n)}
	}
	dbl := func(f float64) bsoncore.Value {
		return bsoncore.Value{Type: bsoncore.TypeDouble, Data: bsoncore.AppendDouble(nil, f)}
	}
	null := bsoncore.Value{Type: bsoncore.TypeNull}
	doc := bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: bsoncore.NewDocumentBuilder().AppendDouble("k", 1).Build()}
	dec := bsoncore.Value{Type: bsoncore.TypeDecimal128, Data: bsoncore.AppendDecimal128(nil, 0, 5)}
	for _, tc := range []struct {
		name  string
		entry bsoncore.Document
		ids   []bsoncore.Value
		want  bool
	}{
		{"every stored ObjectID", oidEntry, oids, true},
		{"one stored ObjectID", oidEntry, oids[500:501], true},
		{"string id in a bucket of ObjectIDs", oidEntry, []bsoncore.Value{str("a")}, false},
		{"null in a bucket of ObjectIDs", oidEntry, []bsoncore.Value{null}, false},
		{"string", mixedEntry, []bsoncore.Value{str("a")}, true},
		{"other string", mixedEntry, []bsoncore.Value{str("b")}, false},
		{"int64 5 equals int32 5", mixedEntry, []bsoncore.Value{i64(5)}, true},
		{"double 5.0 equals int32 5", mixedEntry, []bsoncore.Value{dbl(5)}, true},
		{"double 2.5", mixedEntry, []bsoncore.Value{dbl(2.5)}, true},
		{"int 6", mixedEntry, []bsoncore.Value{i64(6)}, false},
		{"decimal may equal any number", mixedEntry, []bsoncore.Value{dec}, true},
		{"document id, bucket of hashed ids", mixedEntry, []bsoncore.Value{doc}, false},
		{"document id, bucket with a document id", docEntry, []bsoncore.Value{doc}, true},
		{"number, bucket with a document id", docEntry, []bsoncore.Value{i64(1)}, true},
		{"ObjectID, bucket with a document id", docEntry, []bsoncore.Value{oids[0]}, false},
		{"null matches a missing _id", missingEntry, []bsoncore.Value{null}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := NewIDSet(tc.ids)
			got, may, ok := set.MayHold(tc.entry)
			if !ok || got != bid {
				t.Fatalf("entry not read: %v %v", got, ok)
			}
			// Hashing is deterministic: a false positive (about 1%)
			// would show here every time, and none of these has one.
			if may != tc.want {
				t.Fatalf("may hold: %v, want %v", may, tc.want)
			}
		})
	}
	if _, _, ok := NewIDSet(oids[:1]).MayHold(IDIndexMarkerDoc(3)); ok {
		t.Fatal("the marker read as an entry")
	}
	// An entry written before entries had string _ids: {_id: {b, h}}.
	if s, _ := oidEntry.Lookup("_id").StringValueOK(); !strings.HasPrefix(s, "b:"+bid.Hex()+":") {
		t.Fatalf("entry _id %s, want b:<bucket _id>:<hash>", oidEntry.Lookup("_id"))
	}
	nb := bsoncore.NewDocumentBuilder
	legacy := nb().AppendDocument("_id", nb().AppendObjectID("b", bid).AppendInt64("h", 7).Build())
	for _, e := range []string{"s", "n", "u", "f"} {
		legacy.AppendValue(e, oidEntry.Lookup(e))
	}
	if got, may, ok := NewIDSet(oids[:1]).MayHold(legacy.Build()); !ok || !may || got != bid {
		t.Fatalf("an entry of the older _id: %v %v %v", got, may, ok)
	}
	if !IsIDIndexMarker(IDIndexMarkerDoc(3)) || IsIDIndexMarker(oidEntry) {
		t.Fatal("IsIDIndexMarker")
	}
}

// TestIDIndexFalsePositives: ids not in a bucket of 1000 pass its filter
// about 1% of the time.
func TestIDIndexFalsePositives(t *testing.T) {
	oids := make([]bsoncore.Value, 1000)
	for i := range oids {
		oids[i] = oidValue(bson.NewObjectID())
	}
	entry := IDIndexEntry(bson.NewObjectID(), 0, eventsWithIDs(oids...))
	fp := 0
	const probes = 10000
	for i := 0; i < probes; i++ {
		if _, may, _ := NewIDSet([]bsoncore.Value{oidValue(bson.NewObjectID())}).MayHold(entry); may {
			fp++
		}
	}
	if rate := float64(fp) / probes; rate > 0.03 {
		t.Fatalf("false positive rate %.3f, want about 0.01", rate)
	}
	fmt.Printf("event-id index: %d false positives in %d probes of a bucket of 1000 ids (%d-byte entry)\n", fp, probes, len(entry))
}

// TestIDIndexEntryIDNamesContent: entries of the same bucket _id with
// other events get other _ids, so a stale entry never blocks a new one.
func TestIDIndexEntryIDNamesContent(t *testing.T) {
	bid := bson.NewObjectID()
	a := IDIndexEntry(bid, 0, eventsWithIDs(oidValue(bson.NewObjectID())))
	b := IDIndexEntry(bid, 0, eventsWithIDs(oidValue(bson.NewObjectID())))
	if string(a.Lookup("_id").Data) == string(b.Lookup("_id").Data) {
		t.Fatal("two entries of different content share an _id")
	}
}

// TestIDIndexLikely: the bucket whose window holds an ObjectID's time is
// the likely one.
func TestIDIndexLikely(t *testing.T) {
	const hour = int64(3_600_000)
	id := bson.NewObjectIDFromTimestamp(time.UnixMilli(5*hour + 1000))
	set := NewIDSet([]bsoncore.Value{oidValue(id)})
	for _, c := range []struct {
		start int64
		want  bool
	}{{5 * hour, true}, {4 * hour, false}, {6 * hour, false}} {
		e := IDIndexEntry(bson.NewObjectID(), c.start, eventsWithIDs(oidValue(id)))
		if got := set.Likely(e, hour); got != c.want {
			t.Errorf("window at %d h: likely %v, want %v", c.start/hour, got, c.want)
		}
	}
	if NewIDSet([]bsoncore.Value{{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "a")}}).Likely(IDIndexEntry(bson.NewObjectID(), 0, nil), hour) {
		t.Error("a string id has no time")
	}
}

// TestIDIndexScanKeeps: a scan keeps what it read (with the marker's
// version), and a kept snapshot settles a later scan while the marker
// shows its version.
func TestIDIndexScanKeeps(t *testing.T) {
	a, b := oidValue(bson.NewObjectID()), oidValue(bson.NewObjectID())
	ea := IDIndexEntry(bson.NewObjectID(), 0, eventsWithIDs(a))
	eb := IDIndexEntry(bson.NewObjectID(), 0, eventsWithIDs(b))
	s := NewIDIndexScan(NewIDSet([]bsoncore.Value{b}), 3_600_000, true)
	for _, d := range []bsoncore.Document{IDIndexMarkerDoc(5), ea, eb} {
		s.Take(d)
	}
	kept := s.Kept()
	if !s.Complete() || len(s.Candidates()) != 1 || kept == nil || kept.V != 5 || len(kept.Entries) != 3 {
		t.Fatalf("scan: complete %v, candidates %v, kept %+v", s.Complete(), s.Candidates(), kept)
	}
	next := NewIDIndexScan(NewIDSet([]bsoncore.Value{a}), 3_600_000, true)
	if !next.CheckKept([]bsoncore.Document{IDIndexMarkerDoc(5)}, kept) || !next.Complete() || len(next.Candidates()) != 1 {
		t.Fatal("the kept version did not settle the scan")
	}
	if NewIDIndexScan(NewIDSet([]bsoncore.Value{a}), 3_600_000, true).CheckKept([]bsoncore.Document{IDIndexMarkerDoc(6)}, kept) {
		t.Fatal("another version settled the scan")
	}
	gone := NewIDIndexScan(NewIDSet([]bsoncore.Value{a}), 3_600_000, true)
	if !gone.CheckKept(nil, kept) || gone.Complete() {
		t.Fatal("no marker: the scan is settled and cannot answer")
	}
	noMarker := NewIDIndexScan(NewIDSet([]bsoncore.Value{a}), 3_600_000, true)
	noMarker.Take(ea)
	if noMarker.Kept() != nil {
		t.Fatal("kept an index without its marker")
	}
}
