package bucket

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func TestBucketID(t *testing.T) {
	str := bsoncore.Value{Type: bsoncore.TypeString, Data: bsoncore.AppendString(nil, "s1")}
	i32 := bsoncore.Value{Type: bsoncore.TypeInt32, Data: bsoncore.AppendInt32(nil, 1)}
	i64 := bsoncore.Value{Type: bsoncore.TypeInt64, Data: bsoncore.AppendInt64(nil, 1)}
	null := bsoncore.Value{Type: bsoncore.TypeNull}
	const ns = "iot.readings.buckets"
	base := ID(ns, str, 7200_000, 0)
	if got := base.Hex(); got != goldenBucketID {
		t.Errorf("BucketID golden = %s, want %s (the stored ids changed: that needs a migration)", got, goldenBucketID)
	}
	if base != ID(ns, str, 7200_000, 0) {
		t.Errorf("BucketID not stable")
	}
	if got := base.Timestamp().Unix(); got != 7200 {
		t.Errorf("timestamp = %d, want the window start 7200", got)
	}
	others := map[string]bson.ObjectID{
		"ns":    ID("iot.other.buckets", str, 7200_000, 0),
		"meta":  ID(ns, null, 7200_000, 0),
		"start": ID(ns, str, 3600_000, 0),
		"seq":   ID(ns, str, 7200_000, 1),
	}
	for what, id := range others {
		if id == base {
			t.Errorf("ids differing by %s collide", what)
		}
	}
	if ID(ns, i32, 0, 0) == ID(ns, i64, 0, 0) {
		t.Errorf("int32 1 and int64 1 share a bucket id")
	}
	if ID(ns, bsoncore.Value{}, 0, 3) != ID(ns, null, 0, 3) {
		t.Errorf("missing meta is not null")
	}
	// BucketKey.ID agrees with BucketID.
	k := KeyOf(str, 7200_000)
	for seq := range 3 {
		if k.ID(ns, seq) != ID(ns, str, 7200_000, seq) {
			t.Errorf("BucketKey.ID(%d) differs from BucketID", seq)
		}
	}
	if (Key{Start: 5}).ID(ns, 0) != ID(ns, null, 5, 0) {
		t.Errorf("empty key meta is not null")
	}
}

const goldenBucketID = "00001c20128c2bbe64d5341d"
