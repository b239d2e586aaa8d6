package bucket

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
)

// A series' meta value is kept in its buckets (FieldMeta) in a stored
// form, which is the app's value with two changes:
//
//   - the fields of every object in it are sorted by name, as MongoDB
//     normalizes a metaField at insert: {b: 1, a: 1} and {a: 1, b: 1}
//     are one series, read back as {a: 1, b: 1};
//   - field names some upstreams cannot keep in a stored document
//     (FerretDB v1.24 refuses a '.' in a name, a leading '$', a name
//     twice and invalid UTF-8, and drops empty names; MongoDB before 5.0
//     refuses the first two) are escaped, so that the meta, and with it
//     every event of the series, stays storable and readable. MongoDB
//     5.0+ keeps such metas as they are; the proxy escapes them on every
//     upstream, so that the stored format does not depend on the
//     upstream (tsproxy migrate copies buckets between upstreams).
//
// An escaped name is escapeMark followed by the name with '%', '.', '$',
// control bytes, bytes of invalid UTF-8 and escapeMark itself written
// as %XX, then, for the n-th repeat of a name in one object (n >= 1),
// escapeMark and n. Names that begin with escapeMark are escaped too, so
// a stored name that begins with it always is an escaped one and the
// read back is exact. The form keeps the meta's structure:
// a filter on a path of the meta (m.x) still selects buckets upstream,
// and a filter's value is compared in the same form (EscapeMeta).
const escapeMark = "\uE000"

// StoredMeta is meta m as kept in buckets (see above). It returns m
// itself when nothing changes, which is the common case.
func StoredMeta(m bsoncore.Value) bsoncore.Value {
	return rewriteMeta(m, true)
}

// EscapeMeta is a filter's value on the metaField in the stored form,
// without sorting: MongoDB does not normalize a filter, so a filter
// whose object lists fields in another order than the stored one
// matches nothing, as there.
func EscapeMeta(v bsoncore.Value) bsoncore.Value {
	return rewriteMeta(v, false)
}

// EscapeMetaPath is a path inside the metaField (its components after
// the metaField's own name) in the stored form.
func EscapeMetaPath(rest string) string {
	if !strings.Contains(rest, escapeMark) {
		return rest
	}
	parts := strings.Split(rest, ".")
	for i, p := range parts {
		if strings.HasPrefix(p, escapeMark) {
			parts[i] = escapeName(p, 0)
		}
	}
	return strings.Join(parts, ".")
}

// UserMeta is a stored meta read back as the app inserted it (fields in
// sorted order).
func UserMeta(v bsoncore.Value) bsoncore.Value {
	if !holdsEscaped(v) {
		return v
	}
	t, data := unescapeValue(nil, v)
	return bsoncore.Value{Type: t, Data: data}
}

func rewriteMeta(v bsoncore.Value, sorted bool) bsoncore.Value {
	if !metaNeedsRewrite(v, sorted, 0) {
		return v
	}
	data := appendRewritten(nil, v, sorted)
	return bsoncore.Value{Type: v.Type, Data: data}
}

// metaNeedsRewrite says whether v, a meta or a value in one, has an
// object out of order (when sorted) or a name to escape.
func metaNeedsRewrite(v bsoncore.Value, sorted bool, depth int) bool {
	if depth > bsonutil.MaxDepth {
		return false // refused by the meta checks; never rewritten
	}
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		elems, err := bsoncore.Document(v.Data).Elements()
		if err != nil {
			return false
		}
		for i, e := range elems {
			k := e.Key()
			if nameNeedsEscape(k) || (sorted && i > 0 && k <= elems[i-1].Key()) || (!sorted && repeatsName(elems[:i], k)) {
				return true // out of order, a repeated name or one to escape
			}
			if metaNeedsRewrite(e.Value(), sorted, depth+1) {
				return true
			}
		}
	case bsoncore.TypeArray:
		// An array's keys are its positions: one sent with other keys
		// ("00", "x") is stored re-keyed by every upstream, so the meta
		// is re-keyed here too, or its bytes would differ from what
		// the bucket's meta reads back as.
		elems, err := bsoncore.Document(v.Data).Elements()
		if err != nil {
			return false
		}
		for i, e := range elems {
			if e.Key() != strconv.Itoa(i) || metaNeedsRewrite(e.Value(), sorted, depth+1) {
				return true
			}
		}
	}
	return false
}

func repeatsName(before []bsoncore.Element, k string) bool {
	for _, e := range before {
		if e.Key() == k {
			return true
		}
	}
	return false
}

// appendRewritten appends the data of v (not its type or key) rewritten.
func appendRewritten(dst []byte, v bsoncore.Value, sorted bool) []byte {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		elems, _ := bsoncore.Document(v.Data).Elements()
		if sorted {
			elems = slices.Clone(elems)
			// Stable: repeated names keep their order, as in MongoDB.
			slices.SortStableFunc(elems, func(a, b bsoncore.Element) int { return bytes.Compare(a.KeyBytes(), b.KeyBytes()) })
		}
		idx, out := bsoncore.AppendDocumentStart(dst)
		repeats := map[string]int{}
		for _, e := range elems {
			k := e.Key()
			name := k
			n := repeats[k]
			repeats[k] = n + 1
			if nameNeedsEscape(k) || n > 0 {
				name = escapeName(k, n)
			}
			out = appendRewrittenElem(out, name, e.Value(), sorted)
		}
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		return out
	case bsoncore.TypeArray:
		vals, _ := bsoncore.Array(v.Data).Values()
		idx, out := bsoncore.AppendArrayStart(dst)
		for i, x := range vals {
			out = appendRewrittenElem(out, strconv.Itoa(i), x, sorted)
		}
		out, _ = bsoncore.AppendArrayEnd(out, idx)
		return out
	}
	return append(dst, v.Data...)
}

func appendRewrittenElem(dst []byte, key string, v bsoncore.Value, sorted bool) []byte {
	dst = bsoncore.AppendHeader(dst, v.Type, key)
	return appendRewritten(dst, v, sorted)
}

// nameNeedsEscape: k is a name FerretDB cannot store, or begins with
// escapeMark.
func nameNeedsEscape(k string) bool {
	return k == "" || k[0] == '$' || strings.Contains(k, ".") || strings.HasPrefix(k, escapeMark) || !utf8.ValidString(k)
}

// escapeName is k's escaped form; repeat is how many times k came
// before in its object.
func escapeName(k string, repeat int) string {
	var b strings.Builder
	b.WriteString(escapeMark)
	for i := 0; i < len(k); {
		r, size := utf8.DecodeRuneInString(k[i:])
		plain := !(r == utf8.RuneError && size == 1) && r >= 0x20 && r != '%' && r != '.' && r != '$' && r != 0xE000
		if plain {
			b.WriteString(k[i : i+size])
		} else {
			for _, c := range []byte(k[i : i+size]) {
				b.WriteByte('%')
				b.WriteString(strings.ToUpper(strconv.FormatUint(uint64(c)|0x100, 16)[1:]))
			}
		}
		i += size
	}
	if repeat > 0 {
		b.WriteString(escapeMark)
		b.WriteString(strconv.Itoa(repeat))
	}
	return b.String()
}

// unescapeName is the name escapeName made k from (k itself when it is
// not an escaped name).
func unescapeName(k string) string {
	if !strings.HasPrefix(k, escapeMark) {
		return k
	}
	rest := k[len(escapeMark):]
	if i := strings.Index(rest, escapeMark); i >= 0 {
		rest = rest[:i]
	}
	out := make([]byte, 0, len(rest))
	for i := 0; i < len(rest); i++ {
		if rest[i] == '%' && i+2 < len(rest) {
			if c, err := strconv.ParseUint(rest[i+1:i+3], 16, 8); err == nil {
				out = append(out, byte(c))
				i += 2
				continue
			}
		}
		out = append(out, rest[i])
	}
	return string(out)
}

// holdsEscaped says whether v has an escaped name anywhere.
func holdsEscaped(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
		return bytes.Contains(v.Data, []byte(escapeMark))
	}
	return false
}

// unescapeValue is v with every escaped name read back: its type and data.
func unescapeValue(dst []byte, v bsoncore.Value) (bsoncore.Type, []byte) {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument:
		elems, _ := bsoncore.Document(v.Data).Elements()
		idx, out := bsoncore.AppendDocumentStart(dst)
		for _, e := range elems {
			out = appendUnescapedElem(out, unescapeName(e.Key()), e.Value())
		}
		out, _ = bsoncore.AppendDocumentEnd(out, idx)
		return v.Type, out
	case bsoncore.TypeArray:
		vals, _ := bsoncore.Array(v.Data).Values()
		idx, out := bsoncore.AppendArrayStart(dst)
		for i, x := range vals {
			out = appendUnescapedElem(out, strconv.Itoa(i), x)
		}
		out, _ = bsoncore.AppendArrayEnd(out, idx)
		return v.Type, out
	}
	return v.Type, append(dst, v.Data...)
}

func appendUnescapedElem(dst []byte, key string, v bsoncore.Value) []byte {
	dst = bsoncore.AppendHeader(dst, v.Type, key)
	_, dst = unescapeValue(dst, v)
	return dst
}
