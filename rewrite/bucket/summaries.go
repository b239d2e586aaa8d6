package bucket

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rules"
)

// UnsummedFields are the aggregates of lim whose summaries bucket bdoc
// does not say cover every event (FieldSummed): fields a rule took as
// aggregates after the bucket was written.
func UnsummedFields(bdoc bsoncore.Document, lim Limits) []string {
	var out []string
	for _, f := range lim.Aggregates {
		if v, _ := bdoc.Lookup(FieldSummed, f).BooleanOK(); !v {
			out = append(out, f)
		}
	}
	return out
}

// SummariesUpdate is the update statement that gives bucket bdoc the
// summaries of the aggregates it lacks them for (UnsummedFields),
// computed from all its events: min, max, sum, counts, lowBit and mixed
// of each such field, and summed.<field>: true. It applies only to the
// bucket as read (its _id, count and events, or packed events, in the
// filter), so a write that lands between the read and it (a merge's
// top-up, an update, a delete) makes it match nothing, and the bucket is
// left for another pass. ok is false when the bucket needs none.
func SummariesUpdate(raw []byte, rule *rules.Rule, lim Limits) (stmt bsoncore.Document, ok bool, err error) {
	bdoc := bsoncore.Document(raw)
	fields := UnsummedFields(bdoc, lim)
	if len(fields) == 0 {
		return nil, false, nil
	}
	evs, err := StoredEvents(bdoc, rule, lim)
	if err != nil {
		return nil, false, err
	}
	s := Summarize(evs, lim)
	q := bsoncore.NewDocumentBuilder()
	for _, k := range []string{FieldID, FieldCount, FieldPacked, FieldEvents} {
		if v, err := bdoc.LookupErr(k); err == nil {
			q.AppendValue(k, v)
		}
	}
	set := bsoncore.NewDocumentBuilder()
	for i, f := range lim.Aggregates {
		if !slices.Contains(fields, f) {
			continue
		}
		a := s.Aggs[i]
		if a.Present {
			set.AppendValue(FieldMin+"."+f, a.Min).AppendValue(FieldMax+"."+f, a.Max).
				AppendInt32(FieldCounts+"."+f, int32(a.N)).AppendInt32(FieldLowBit+"."+f, a.LowBit)
			set.AppendValue(FieldSum+"."+f, numValue(a.Sum))
		}
		if a.Mixed {
			set.AppendBoolean(FieldMixed+"."+f, true)
		}
		set.AppendBoolean(FieldSummed+"."+f, true)
	}
	u := bsoncore.NewDocumentBuilder().AppendDocument("$set", set.Build()).Build()
	return bsoncore.NewDocumentBuilder().AppendDocument("q", q.Build()).AppendDocument("u", u).Build(), true, nil
}

// numValue is n as a BSON value, as AppendNum writes it.
func numValue(n Num) bsoncore.Value {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = AppendNum(d, "n", n)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return bsoncore.Document(d).Lookup("n")
}
