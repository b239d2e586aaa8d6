package fanout

import (
	"slices"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// InsertPart is the sub-insert of one partition.
type InsertPart struct {
	// Collection is the partition's bucket collection.
	Collection string
	// Command is the client's insert with only this part's documents, in a
	// "documents" sequence.
	Command rewrite.Command
	// Indexes maps a document's index in Command to its index in the
	// client's insert (for writeErrors).
	Indexes []int
}

// SplitInsert splits an insert on a partitioned rule. An ordered insert
// is cut into runs of consecutive documents of one partition, run in
// order, so that the first error still stops everything after it; an
// unordered one into one part per partition. An event whose time cannot
// place it (the insert refuses it with a writeError) joins the part
// before it, or the first part, or the partition of now (ms) when no event
// has a time. A command that is not a well-formed insert is returned
// whole, in the partition of now, for the insert path to refuse.
func SplitInsert(cmd rewrite.Command, rule *rules.Rule, now int64) (parts []InsertPart, ordered bool) {
	whole := []InsertPart{{Collection: rule.PartitionCollection(now), Command: cmd}}
	docs, err := rewrite.CommandDocuments(cmd, "documents")
	if err != nil || len(docs) == 0 {
		return whole, true
	}
	ordered, err = bsonutil.Bool(cmd.Body, "ordered", true)
	if err != nil {
		return whole, true
	}
	colls := eventPartitions(docs, rule, now)
	byColl := map[string]int{}
	for i, coll := range colls {
		var at int
		switch {
		case ordered && len(parts) > 0 && parts[len(parts)-1].Collection == coll:
			at = len(parts) - 1
		case ordered:
			at = -1
		default:
			var ok bool
			if at, ok = byColl[coll]; !ok {
				at = -1
			}
		}
		if at < 0 {
			at = len(parts)
			byColl[coll] = at
			parts = append(parts, InsertPart{Collection: coll})
		}
		p := &parts[at]
		p.Indexes = append(p.Indexes, i)
		if len(p.Command.Sequences) == 0 {
			p.Command.Sequences = []rewrite.Sequence{{Identifier: "documents"}}
		}
		p.Command.Sequences[0].Documents = append(p.Command.Sequences[0].Documents, docs[i])
	}
	body := withoutFields(cmd.Body, "documents")
	for i := range parts {
		parts[i].Command.Body = body
	}
	return parts, ordered
}

// eventPartitions is the partition collection of each document (see
// SplitInsert for those without a usable time).
func eventPartitions(docs []bsoncore.Document, rule *rules.Rule, now int64) []string {
	colls := make([]string, len(docs))
	last := ""
	for i, d := range docs {
		if t, ok := bsonutil.Lookup(d, rule.TimeField); ok {
			if ms, ok := t.DateTimeOK(); ok {
				if start := rule.WindowStartMillis(ms); start <= ms {
					last = rule.PartitionCollection(start)
				}
			}
		}
		colls[i] = last
	}
	first := ""
	for _, c := range colls {
		if c != "" {
			first = c
			break
		}
	}
	if first == "" {
		first = rule.PartitionCollection(now)
	}
	for i := range colls {
		if colls[i] != "" {
			break
		}
		colls[i] = first
	}
	return colls
}

// InsertPartFailed reports whether a part's reply stops an ordered
// insert: a command error or a writeError.
func InsertPartFailed(reply []byte) bool {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		return true
	}
	_, has := bsonutil.Lookup(doc, "writeErrors")
	return has
}

// MergeInsertReplies is the reply of the client's insert from the
// replies of its parts (replies of the parts run, in order; an ordered
// insert stops at a failed part): n summed, writeErrors renumbered to the
// client's indexes and sorted, the first writeConcernError kept. The
// events of a part that failed as a command (ok: 0), and of the parts an
// ordered insert did not run, are each reported not written, when any
// part wrote: the client learns what is stored (it was told nothing was,
// and could write it again), and the rollups, which count every event
// the reply does not name, counted the parts never run. With nothing
// written, a command error is the answer itself, as the upstream gave it.
func MergeInsertReplies(parts []InsertPart, replies [][]byte) []byte {
	var n int64
	type werr struct {
		index int
		doc   bsoncore.Document
	}
	var errs []werr
	var wce bsoncore.Value
	written := false
	for _, r := range replies {
		doc := bsoncore.Document(r)
		if k, _ := doc.Lookup("n").AsInt64OK(); doc.Validate() == nil && mongoerr.IsOK(doc) && k > 0 {
			written = true
		}
	}
	var stop *mongoerr.Error // why an ordered insert stopped
	notWritten := func(indexes []int, code mongoerr.Code, msg string) {
		for _, g := range indexes {
			errs = append(errs, werr{g, bsoncore.NewDocumentBuilder().AppendInt32("index", int32(g)).
				AppendInt32("code", int32(code)).AppendString("errmsg", msg).Build()})
		}
	}
	for i, r := range replies {
		doc := bsoncore.Document(r)
		if doc.Validate() != nil || !mongoerr.IsOK(doc) {
			if !written || i >= len(parts) || len(parts[i].Indexes) == 0 {
				return r
			}
			e := mongoerr.FromReply(doc, "insert failed")
			stop = e
			notWritten(parts[i].Indexes, e.Code, e.Msg)
			continue
		}
		if stop == nil {
			if v, ok := bsonutil.Lookup(doc, "writeErrors"); ok {
				vals, _ := bsoncore.Document(v.Data).Values()
				if len(vals) > 0 {
					if d, ok := vals[0].DocumentOK(); ok {
						code, _ := d.Lookup("code").AsInt64OK()
						msg, _ := d.Lookup("errmsg").StringValueOK()
						stop = &mongoerr.Error{Code: mongoerr.Code(code), Msg: msg}
					}
				}
			}
		}
		if v, ok := bsonutil.Lookup(doc, "n"); ok {
			k, _ := v.AsInt64OK()
			n += k
		}
		if v, ok := bsonutil.Lookup(doc, "writeConcernError"); ok && wce.Type == 0 {
			wce = v
		}
		arr, ok := bsonutil.Lookup(doc, "writeErrors")
		if !ok {
			continue
		}
		vals, _ := bsoncore.Document(arr.Data).Values()
		for _, v := range vals {
			d, ok := v.DocumentOK()
			if !ok {
				continue
			}
			local, _ := d.Lookup("index").AsInt64OK()
			global := int(local)
			if local >= 0 && int(local) < len(parts[i].Indexes) {
				global = parts[i].Indexes[local]
			}
			errs = append(errs, werr{global, renumbered(d, global)})
		}
	}
	if len(replies) < len(parts) && stop != nil {
		msg := "event not written: an earlier part of this ordered insert failed: " + stop.Msg
		for _, p := range parts[len(replies):] {
			notWritten(p.Indexes, stop.Code, msg)
		}
	}
	slices.SortStableFunc(errs, func(a, b werr) int { return a.index - b.index })
	// A statement run on every partition (delete) fails alike in each.
	errs = slices.CompactFunc(errs, func(a, b werr) bool { return a.index == b.index })
	idx, out := bsoncore.AppendDocumentStart(nil)
	out = bsoncore.AppendInt32Element(out, "n", int32(n))
	if len(errs) > 0 {
		aidx, a := bsoncore.AppendArrayElementStart(out, "writeErrors")
		for i, e := range errs {
			a = bsoncore.AppendDocumentElement(a, bsonutil.Itoa(i), e.doc)
		}
		out, _ = bsoncore.AppendArrayEnd(a, aidx)
	}
	if wce.Type != 0 {
		out = bsoncore.AppendValueElement(out, "writeConcernError", wce)
	}
	out = bsoncore.AppendDoubleElement(out, "ok", 1)
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// renumbered copies a writeError with index set to index.
func renumbered(d bsoncore.Document, index int) bsoncore.Document {
	return bsonutil.ReplaceField(d, "index", func(dst []byte) []byte { return bsoncore.AppendInt32Element(dst, "index", int32(index)) })
}

// DeleteLimitOne reports whether a delete has a statement with limit 1,
// which deletes one event of all the partitions, not one per partition.
func DeleteLimitOne(cmd rewrite.Command) bool {
	docs, err := rewrite.CommandDocuments(cmd, "deletes")
	if err != nil {
		return false // the delete path refuses it
	}
	for _, d := range docs {
		if v, ok := bsonutil.Lookup(d, "limit"); ok {
			if n, ok := v.AsInt64OK(); ok && n != 0 {
				return true
			}
			if f, ok := v.DoubleOK(); ok && f != 0 {
				return true
			}
		}
	}
	return false
}
