package layout

import (
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rules"
)

// Packed slot maps. FerretDB stores a document as JSON and decodes all of
// it to read or update any of it, at a cost per field: a find by _id of
// an hour of one-second slots (3,600 fields) took 106 ms on the embedded
// upstream, its replacement 111 ms, against 3.2 and 4.6 ms for the same
// values as one compressed binary field (tsbench shapes). On such
// upstreams (caps.Upstream.PackedEvents) the map of a layout bucket, a
// slots bucket's values or a counter's slots, is the BSON of the
// document {"<slot>": value}, in slot order, in one binary field: one
// zstd frame of it (SlotsPackedZstdSubtype) where that is smaller (an
// hour of one-second doubles, 50 KB raw, is about a fifth of that), raw
// otherwise (SlotsPackedSubtype). A slot is there when it was written
// (no presence map). The proxy reads both forms and, on these upstreams,
// writes this one, whole; a rule with packed: false keeps a field per
// slot (rules.LayoutOptions.Unpacked).

// The binary subtypes of packed slot maps: user-defined ones (0x80 and
// above), next to the events' (rewrite/bucket's SubtypeZstdArray).
const (
	SlotsPackedSubtype     = 0x81
	SlotsPackedZstdSubtype = 0x82
)

// packLayout says whether rule's buckets are written packed on an
// upstream that packs events (packedUpstream): unless the rule says
// packed: false.
func packLayout(rule *rules.Rule, packedUpstream bool) bool {
	return packedUpstream && !rule.LayoutOptions.Unpacked
}

// isPackedMap says whether a stored bucket keeps field packed (binary);
// whether it is a valid packed map, packedMap says.
func isPackedMap(doc bsoncore.Document, field string) bool {
	if doc == nil {
		return false
	}
	v, err := doc.LookupErr(field)
	return err == nil && v.Type == bsoncore.TypeBinary
}

// packedMap returns the document of a bucket's packed field; ok is false
// where field is not packed. err: packed, but not a valid document
// (damaged), the reader's error.
func packedMap(doc bsoncore.Document, field string) (inner bsoncore.Document, ok bool, err error) {
	if doc == nil {
		return nil, false, nil
	}
	sub, data, isBin := doc.Lookup(field).BinaryOK()
	if !isBin {
		return nil, false, nil
	}
	switch sub {
	case SlotsPackedSubtype:
	case SlotsPackedZstdSubtype:
		if data, err = bucket.Decompress(data); err != nil {
			return nil, true, fmt.Errorf("packed %q: %w", field, err)
		}
	default:
		return nil, true, fmt.Errorf("%q is binary data of subtype %#x, not a packed slot map (%#x, or %#x compressed)", field, sub, SlotsPackedSubtype, SlotsPackedZstdSubtype)
	}
	if err := bsoncore.Document(data).Validate(); err != nil {
		return nil, true, fmt.Errorf("packed %q is not a BSON document: %w", field, err)
	}
	return bsoncore.Document(data), true, nil
}

// appendPackedMap appends field holding the written slots of g, packed,
// compressed when compress says so and it is smaller.
func appendPackedMap(dst []byte, field string, g slotGrid, compress bool) []byte {
	ii, inner := bsoncore.AppendDocumentStart(nil)
	for s, w := range g.written {
		if w {
			inner = bsoncore.AppendValueElement(inner, strconv.Itoa(s), g.vals[s])
		}
	}
	inner, _ = bsoncore.AppendDocumentEnd(inner, ii)
	if compress {
		if z, ok := bucket.Compress(inner); ok {
			return bsoncore.AppendBinaryElement(dst, field, SlotsPackedZstdSubtype, z)
		}
	}
	return bsoncore.AppendBinaryElement(dst, field, SlotsPackedSubtype, inner)
}
