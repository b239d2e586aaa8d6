package updates

import (
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/join"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/updateop"
	"github.com/tsproxy/tsproxy/rules"
)

// Request is a parsed update command on a bucketed namespace.
type Request struct {
	rule    *rules.Rule
	ordered bool
	// find is a delete request of the statements' filters: it finds the
	// events and builds the bucket reads and writes.
	find       *deletes.Request
	Statements []*Statement
	// vars are the command's let variables.
	vars map[string]bsoncore.Value
}

// Statement is one entry of the update's "updates".
type Statement struct {
	Index  int
	Filter bsoncore.Document
	Update *updateop.Update
	Multi  bool
	Upsert bool
	// Err is why the statement cannot run: its write error, reported
	// without reaching the upstream.
	Err error
	// find is the statement's match, as a delete statement.
	find      *deletes.Statement
	collation bsoncore.Value
	// remove: a findAndModify's remove, which takes the matched event
	// out rather than update it.
	remove bool
	// sort, for a findAndModify, orders its matches: the first is the
	// one changed (every match is read to find it).
	sort bsoncore.Document
}

// statementFields are the fields an update statement may have
// (MongoDB's); those refused are refused by name.
var statementFields = map[string]bool{
	"q": true, "u": true, "multi": true, "upsert": true, "arrayFilters": true,
	"collation": true, "hint": true, "c": true, "sort": true, "upsertSupplied": true,
}

// NewRequest parses an update command (statements in the body or in an
// "updates" document sequence). A malformed command or statement fails
// the command, as the server's parser does; a statement the proxy cannot
// run is that statement's write error.
func NewRequest(cmd rewrite.Command, rule *rules.Rule, upstream caps.Upstream) (*Request, error) {
	if err := query.CheckTarget(cmd.Body, rule, "update"); err != nil {
		return nil, err
	}
	if rewrite.InTransaction(cmd.Body) {
		return nil, mongoerr.Errorf(mongoerr.OperationNotSupportedInTransaction, "Cannot perform a multi-document transaction on a time-series collection: %s", rule.Namespace)
	}
	vars, err := letVars(cmd.Body, "let", nil)
	if err != nil {
		return nil, err
	}
	ordered, err := bsonutil.Bool(cmd.Body, "ordered", true)
	if err != nil {
		return nil, err
	}
	docs, err := rewrite.CommandDocuments(cmd, "updates")
	if err != nil {
		return nil, err
	}
	r := &Request{rule: rule, ordered: ordered, vars: vars}
	var filters []bsoncore.Document
	for i, d := range docs {
		st, err := r.parseStatement(i, d)
		if err != nil {
			return nil, err
		}
		r.Statements = append(r.Statements, st)
		filters = append(filters, findStatement(st))
	}
	find, err := deletes.NewRequest(rewrite.Command{Body: findCommand(cmd.Body, filters)}, rule, deletes.Options{Caps: upstream})
	if err != nil {
		return nil, err
	}
	r.find = find
	for i, st := range r.Statements {
		st.find = find.Statements[i]
		if st.Err == nil {
			st.Err = st.find.Err
		}
	}
	return r, nil
}

func (r *Request) parseStatement(i int, d bsoncore.Document) (*Statement, error) {
	st := &Statement{Index: i}
	elems, err := d.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "update statement %d: %v", i, err)
	}
	for _, e := range elems {
		if !statementFields[e.Key()] {
			return nil, mongoerr.Errorf(mongoerr.IDLUnknownField, "BSON field 'update.updates.%s' is an unknown field.", e.Key())
		}
	}
	q, ok := bsonutil.Lookup(d, "q")
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.IDLFailedToParse, "BSON field 'update.updates.q' is missing but a required field")
	}
	if st.Filter, ok = q.DocumentOK(); !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'update.updates.q' is the wrong type '%s', expected type 'object'", bsonutil.TypeName(q.Type))
	}
	u, ok := bsonutil.Lookup(d, "u")
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.IDLFailedToParse, "BSON field 'update.updates.u' is missing but a required field")
	}
	if st.Multi, err = bsonutil.Bool(d, "multi", false); err != nil {
		return nil, err
	}
	st.collation, _ = bsonutil.Lookup(d, "collation")
	if st.Upsert, err = bsonutil.Bool(d, "upsert", false); err != nil {
		return nil, err
	}
	af, _ := bsonutil.Lookup(d, "arrayFilters")
	if st.Update, err = updateop.ParseWithFilters(u, af); err != nil {
		st.Err = err
		return st, nil
	}
	vars, err := letVars(d, "c", r.vars)
	if err != nil {
		return nil, err
	}
	if err := st.Update.Bind(vars); err != nil {
		st.Err = err
		return st, nil
	}
	if st.Multi && st.Update.Kind() == updateop.Replacement {
		st.Err = mongoerr.Errorf(mongoerr.FailedToParse, "multi update is not supported for replacement-style update")
		return st, nil
	}
	if v, ok := bsonutil.Lookup(d, "hint"); ok && v.Type != bsoncore.TypeNull {
		if st.Err = query.CheckHint(r.rule, v); st.Err != nil {
			return st, nil
		}
	}
	if v, ok := bsonutil.Lookup(d, "sort"); ok && v.Type != bsoncore.TypeNull {
		st.Err = query.RuleErrorf(r.rule, mongoerr.NotImplemented, "update option %q is not supported on a time-series collection through the proxy", "sort")
		return st, nil
	}
	return st, nil
}

// letVars are the variables of doc's field (a command's let, a
// statement's c) over those of outer.
func letVars(doc bsoncore.Document, field string, outer map[string]bsoncore.Value) (map[string]bsoncore.Value, error) {
	v, ok := bsonutil.Lookup(doc, field)
	if !ok || v.Type == bsoncore.TypeNull {
		return outer, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'update.%s' is the wrong type '%s', expected type 'object'", field, bsonutil.TypeName(v.Type))
	}
	vars := make(map[string]bsoncore.Value, len(outer))
	for k, x := range outer {
		vars[k] = x
	}
	elems, _ := d.Elements()
	for _, e := range elems {
		if err := join.CheckVarName(e.Key()); err != nil {
			return nil, err
		}
		vars[e.Key()] = e.Value()
	}
	return vars, nil
}

// findStatement is the delete statement that finds st's events: its
// filter, its collation, limit 1 unless multi.
func findStatement(st *Statement) bsoncore.Document {
	limit := int32(1)
	if st.Multi {
		limit = 0
	}
	filter := st.Filter
	if filter == nil {
		filter = bsoncore.NewDocumentBuilder().Build()
	}
	b := bsoncore.NewDocumentBuilder().AppendDocument("q", filter).AppendInt32("limit", limit)
	if st.collation.Type != 0 {
		b.AppendValue("collation", st.collation)
	}
	return b.Build()
}

// findCommand is a delete command of the update's target and generic
// arguments with the statements' filters: what deletes.NewRequest parses
// into matches and the bucket writes' carried arguments.
func findCommand(body bsoncore.Document, filters []bsoncore.Document) bsoncore.Document {
	elems, _ := body.Elements()
	idx, d := bsoncore.AppendDocumentStart(nil)
	for i, e := range elems {
		switch {
		case i == 0:
			d = bsoncore.AppendValueElement(d, "delete", e.Value())
		case e.Key() == "updates" || e.Key() == "let" || e.Key() == "bypassDocumentValidation":
		default:
			d = append(d, e...)
		}
	}
	aidx, a := bsoncore.AppendArrayElementStart(d, "deletes")
	for i, f := range filters {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), f)
	}
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}
