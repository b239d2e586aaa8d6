package insert

import (
	"fmt"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MayBeUnseenRetry says whether cmd is a retryable write that an upstream
// with caps cannot itself recognise as a retry.
func MayBeUnseenRetry(cmd rewrite.Command, caps caps.Upstream) bool {
	if caps.StmtIDs {
		return false // the upstream implements retryable writes
	}
	if _, ok := bsonutil.Lookup(cmd.Body, "txnNumber"); !ok {
		return false
	}
	return !rewrite.InTransaction(cmd.Body) // a transaction statement is not retried alone
}

// StoredEventIdentities adds to set the identity of every event of a
// stored bucket (as read back from the bucket collection).
func StoredEventIdentities(bdoc bson.Raw, rule *rules.Rule, set map[string]bool) {
	meta := bdoc.Lookup(bucket.FieldMeta)
	vals, _ := bucket.EventValues(bsoncore.Document(bdoc))
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			continue
		}
		ev := bson.Raw(d)
		id, err := ev.LookupErr("_id")
		ts, terr := ev.LookupErr(rule.TimeField)
		if err != nil || terr != nil {
			continue
		}
		set[identity(id, meta, ts)] = true
	}
}

// eventIdentity is what a stored copy of an incoming event matches: its
// _id, its series (the metaField value, null when absent) and its time.
func eventIdentity(doc bsoncore.Document, rule *rules.Rule) (string, bool) {
	raw := bson.Raw(doc)
	id, err := raw.LookupErr("_id")
	if err != nil {
		return "", false
	}
	ts, err := raw.LookupErr(rule.TimeField)
	if err != nil {
		return "", false
	}
	meta := bson.RawValue{Type: bson.TypeNull}
	if rule.MetaField != "" {
		if m, err := raw.LookupErr(rule.MetaField); err == nil {
			// As the bucket keeps it (fields sorted, names escaped).
			sm := bucket.StoredMeta(bsoncore.Value{Type: bsoncore.Type(m.Type), Data: m.Value})
			meta = bson.RawValue{Type: bson.Type(sm.Type), Value: sm.Data}
		}
	}
	return identity(id, meta, ts), true
}

func identity(id, meta, ts bson.RawValue) string {
	if meta.Type == 0 || meta.Type == bson.TypeUndefined {
		meta = bson.RawValue{Type: bson.TypeNull}
	}
	return fmt.Sprintf("%d:%x|%d:%x|%d:%x", id.Type, id.Value, meta.Type, meta.Value, ts.Type, ts.Value)
}

// ReplayFilter is a client's insert with the events already stored left
// out.
type ReplayFilter struct {
	// Command is the insert of the events not stored yet; empty (no
	// documents) when AllStored.
	Command rewrite.Command
	orig    []int // index in the client's batch of each event of Command
	total   int   // events in the client's batch
	skipped int   // events found stored
}

// WithoutStored returns the filter of cmd against the identities in
// stored, or nil when none of its events is stored (or cmd is malformed:
// Insert reports that).
func WithoutStored(cmd rewrite.Command, rule *rules.Rule, stored map[string]bool) *ReplayFilter {
	if len(stored) == 0 || rule == nil {
		return nil
	}
	docs, err := rewrite.CommandDocuments(cmd, "documents")
	if err != nil {
		return nil
	}
	f := &ReplayFilter{total: len(docs)}
	keep := make([]bsoncore.Document, 0, len(docs))
	for i, d := range docs {
		if k, ok := eventIdentity(d, rule); ok && stored[k] {
			f.skipped++
			continue
		}
		keep = append(keep, d)
		f.orig = append(f.orig, i)
	}
	if f.skipped == 0 {
		return nil
	}
	f.Command = withDocuments(cmd, keep)
	return f
}

// Skipped is the number of events found stored.
func (f *ReplayFilter) Skipped() int { return f.skipped }

// AllStored says every event of the client's batch was found stored.
func (f *ReplayFilter) AllStored() bool { return f.skipped == f.total }

// AllStoredReply is the reply to an insert every event of which is stored.
func (f *ReplayFilter) AllStoredReply() []byte {
	idx, out := bsoncore.AppendDocumentStart(nil)
	out = bsoncore.AppendInt32Element(out, "n", int32(f.total))
	out = bsoncore.AppendDoubleElement(out, "ok", 1)
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// MapReply turns the reply to the filtered insert into the reply to the
// client's: the stored events count as inserted, and writeErrors name
// indexes in the client's batch.
func (f *ReplayFilter) MapReply(reply []byte) []byte {
	elems, err := bsoncore.Document(reply).Elements()
	if err != nil {
		return reply
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		switch e.Key() {
		case "n":
			n, _ := e.Value().AsInt64OK()
			out = bsoncore.AppendInt32Element(out, "n", int32(n)+int32(f.skipped))
		case "writeErrors":
			out = f.appendWriteErrors(out, e.Value())
		default:
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

func (f *ReplayFilter) appendWriteErrors(dst []byte, v bsoncore.Value) []byte {
	arr, _ := v.ArrayOK()
	vals, _ := arr.Values()
	ai, dst := bsoncore.AppendArrayElementStart(dst, "writeErrors")
	for i, we := range vals {
		doc, _ := we.DocumentOK()
		elems, _ := doc.Elements()
		di, d := bsoncore.AppendDocumentElementStart(dst, strconv.Itoa(i))
		for _, e := range elems {
			if e.Key() == "index" {
				if n, ok := e.Value().AsInt64OK(); ok && n >= 0 && int(n) < len(f.orig) {
					d = bsoncore.AppendInt32Element(d, "index", int32(f.orig[n]))
					continue
				}
			}
			d = append(d, e...)
		}
		dst, _ = bsoncore.AppendDocumentEnd(d, di)
	}
	dst, _ = bsoncore.AppendArrayEnd(dst, ai)
	return dst
}

// withDocuments is cmd with its documents (in a sequence or in the body)
// replaced by docs.
func withDocuments(cmd rewrite.Command, docs []bsoncore.Document) rewrite.Command {
	out := rewrite.Command{Body: cmd.Body}
	inSeq := false
	for _, s := range cmd.Sequences {
		if s.Identifier == "documents" {
			s = rewrite.Sequence{Identifier: s.Identifier, Documents: docs}
			inSeq = true
		}
		out.Sequences = append(out.Sequences, s)
	}
	if inSeq {
		return out
	}
	elems, _ := cmd.Body.Elements()
	idx, body := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() != "documents" {
			body = append(body, e...)
			continue
		}
		ai, b := bsoncore.AppendArrayElementStart(body, "documents")
		for i, d := range docs {
			b = bsoncore.AppendDocumentElement(b, strconv.Itoa(i), d)
		}
		body, _ = bsoncore.AppendArrayEnd(b, ai)
	}
	body, _ = bsoncore.AppendDocumentEnd(body, idx)
	out.Body = body
	return out
}
