package bucket

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MongoDB compares a string and a symbol of the same characters equal
// (canonicalizeBSONType puts both in the string class, and the _id index's
// KeyString encodes both as kStringLike): {_id: "abc"} finds an _id stored
// as Symbol("abc"), and {_id: Symbol("abc")} finds "abc". The Bloom filter
// must not rule either out.
func TestIDIndexSymbolEqualsString(t *testing.T) {
	str := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "abc")}
	sym := bsoncore.Value{Type: bsoncore.TypeSymbol, Data: bsoncore.AppendString(nil, "abc")}
	bid := bson.NewObjectID()
	for _, tc := range []struct {
		name          string
		stored, query bsoncore.Value
	}{
		{"string query, symbol stored", sym, str},
		{"symbol query, string stored", str, sym},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entry := IDIndexEntry(bid, 0, eventsWithIDs(tc.stored))
			_, may, ok := NewIDSet([]bsoncore.Value{tc.query}).MayHold(entry)
			if !ok || !may {
				t.Fatalf("MayHold = %v (ok %v): the bucket holding the equal _id is ruled out", may, ok)
			}
		})
	}
}

// TestIDIndexUnhashedEntryTakesStrings: an entry marked u (an _id it did
// not hash) may hold a symbol written before symbols were hashed as
// strings: a string id does not rule it out.
func TestIDIndexUnhashedEntryTakesStrings(t *testing.T) {
	doc := bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: bsoncore.NewDocumentBuilder().AppendInt32("k", 1).Build()}
	entry := IDIndexEntry(bson.NewObjectID(), 0, eventsWithIDs(doc))
	if u, _ := entry.Lookup(idEntryUnhashed).BooleanOK(); !u {
		t.Fatalf("entry of a document _id not marked u: %s", bson.Raw(entry))
	}
	str := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "zzz")}
	if _, may, ok := NewIDSet([]bsoncore.Value{str}).MayHold(entry); !ok || !may {
		t.Fatalf("MayHold = %v (ok %v): a string ruled out an entry marked u", may, ok)
	}
}
