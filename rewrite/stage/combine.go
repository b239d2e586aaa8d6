package stage

import (
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Combining staged inserts. On FerretDB most of what an insert of a few
// staged documents costs is the command itself (its transaction, its
// catalog lookups), not the documents: staged events are one binary
// value each. Many clients sending one event at a time therefore cost the
// upstream far more than the same events in one insert. So the proxy
// sends the staged inserts of concurrent clients into one staging
// collection, with the same command body (same write concern, same
// users), as one upstream insert, and hands each client its part of the
// reply. Nothing waits for company: an insert goes at once when none is
// in flight, and those that arrive while one is in flight go together
// next (group commit). Each staged document's _id still names its own
// write, so retries are recognised as before.

// Bounds of one combined insert: well inside MongoDB's 100,000 documents
// and 48 MB a message, and small enough that the clients that ride along
// wait for a short insert.
const (
	MaxCombinedDocs  = 1000
	MaxCombinedBytes = 8 << 20
)

// Combine is the upstream insert of the parts' documents, in order, under
// body (the parts' shared command).
func Combine(body []byte, parts []*rewrite.Sequence) rewrite.Upstream {
	seq := &rewrite.Sequence{Identifier: "documents"}
	for _, p := range parts {
		seq.Documents = append(seq.Documents, p.Documents...)
	}
	return rewrite.Upstream{Body: body, Seq: seq}
}

// SplitReply maps the reply to a combined insert to each part's reply,
// parts having sizes documents in order: n and writeErrors (indexes made
// the part's own) split by position, every other field (ok, a
// writeConcernError, the cluster time...) as it is. A reply that is not
// ok, or not an insert's, is every part's.
func SplitReply(reply []byte, sizes []int) [][]byte {
	out := make([][]byte, len(sizes))
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		for i := range out {
			out[i] = reply
		}
		return out
	}
	errs := writeErrorsByPart(doc, sizes)
	elems, _ := doc.Elements()
	for i, size := range sizes {
		idx, b := bsoncore.AppendDocumentStart(nil)
		for _, e := range elems {
			switch e.Key() {
			case "n":
				b = bsoncore.AppendInt32Element(b, "n", int32(size-len(errs[i])))
			case "writeErrors":
				if len(errs[i]) == 0 {
					continue
				}
				aidx, arr := bsoncore.AppendArrayElementStart(b, "writeErrors")
				for j, we := range errs[i] {
					arr = bsoncore.AppendDocumentElement(arr, strconv.Itoa(j), we)
				}
				b, _ = bsoncore.AppendArrayEnd(arr, aidx)
			default:
				b = append(b, e...)
			}
		}
		b, _ = bsoncore.AppendDocumentEnd(b, idx)
		out[i] = b
	}
	return out
}

// writeErrorsByPart sorts a reply's write errors into the parts their
// index falls in, each re-indexed from its part's first document.
func writeErrorsByPart(doc bsoncore.Document, sizes []int) [][]bsoncore.Document {
	out := make([][]bsoncore.Document, len(sizes))
	arr, ok := doc.Lookup("writeErrors").ArrayOK()
	if !ok {
		return out
	}
	vals, _ := arr.Values()
	for _, v := range vals {
		we, ok := v.DocumentOK()
		if !ok {
			continue
		}
		index, ok := we.Lookup("index").AsInt64OK()
		if !ok {
			continue
		}
		part, at := partOf(index, sizes)
		if part < 0 {
			continue
		}
		out[part] = append(out[part], withIndex(we, at))
	}
	return out
}

// partOf is the part a combined document index falls in, and its index
// there (-1 when past the end).
func partOf(index int64, sizes []int) (part int, at int64) {
	for i, size := range sizes {
		if index < int64(size) {
			return i, index
		}
		index -= int64(size)
	}
	return -1, 0
}

// withIndex is a write error with its index replaced.
func withIndex(we bsoncore.Document, index int64) bsoncore.Document {
	elems, _ := we.Elements()
	idx, b := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() == "index" {
			b = bsoncore.AppendInt32Element(b, "index", int32(index))
			continue
		}
		b = append(b, e...)
	}
	b, _ = bsoncore.AppendDocumentEnd(b, idx)
	return b
}
