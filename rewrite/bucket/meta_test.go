package bucket

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func metaValue(t *testing.T, v any) bsoncore.Value {
	t.Helper()
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return bsoncore.Value{Type: bsoncore.Type(typ), Data: data}
}

// TestStoredMeta: the stored form sorts object fields (MongoDB's
// normalization) and escapes names FerretDB cannot store; UserMeta reads
// it back as the sorted value, names as inserted.
func TestStoredMeta(t *testing.T) {
	d := func(kv ...any) bson.D {
		var out bson.D
		for i := 0; i < len(kv); i += 2 {
			out = append(out, bson.E{Key: kv[i].(string), Value: kv[i+1]})
		}
		return out
	}
	tests := []struct {
		name           string
		in, stored, rd any
	}{
		{"scalar", "a", "a", "a"},
		{"sorted", d("a", 1, "b", 1), d("a", 1, "b", 1), d("a", 1, "b", 1)},
		{"unsorted", d("b", 1, "a", 1), d("a", 1, "b", 1), d("a", 1, "b", 1)},
		{"nested unsorted", d("z", d("d", 1, "c", 1), "a", bson.A{d("y", 1, "x", 1)}), d("a", bson.A{d("x", 1, "y", 1)}, "z", d("c", 1, "d", 1)), d("a", bson.A{d("x", 1, "y", 1)}, "z", d("c", 1, "d", 1))},
		{"dotted", d("a.b", 4), d("\uE000a%2Eb", 4), d("a.b", 4)},
		{"dollar", d("x", d("$a", 4)), d("x", d("\uE000%24a", 4)), d("x", d("$a", 4))},
		{"empty", d("", 4), d("\uE000", 4), d("", 4)},
		{"repeated", d("a", 4, "a", 5), d("a", 4, "\uE000a\uE0001", 5), d("a", 4, "a", 5)},
		{"mark", d("\uE000x", 1), d("\uE000%EE%80%80x", 1), d("\uE000x", 1)},
		{"percent", d("a%.b", 1), d("\uE000a%25%2Eb", 1), d("a%.b", 1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in, want, rd := metaValue(t, tc.in), metaValue(t, tc.stored), metaValue(t, tc.rd)
			got := StoredMeta(in)
			if !got.Equal(want) {
				t.Fatalf("StoredMeta = %s, want %s", got, want)
			}
			if back := UserMeta(got); !back.Equal(rd) {
				t.Fatalf("UserMeta = %s, want %s", back, rd)
			}
		})
	}
}

// TestEscapeMetaKeepsOrder: a filter's value is escaped, not sorted.
func TestEscapeMetaKeepsOrder(t *testing.T) {
	in := metaValue(t, bson.D{{Key: "b", Value: 1}, {Key: "a.x", Value: 1}})
	want := metaValue(t, bson.D{{Key: "b", Value: 1}, {Key: "\uE000a%2Ex", Value: 1}})
	if got := EscapeMeta(in); !got.Equal(want) {
		t.Fatalf("EscapeMeta = %s, want %s", got, want)
	}
	if got := EscapeMetaPath(".x.\uE000y"); got != ".x.\uE000%EE%80%80y" {
		t.Fatalf("EscapeMetaPath = %q", got)
	}
}
