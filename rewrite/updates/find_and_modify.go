package updates

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
)

// findAndModifyFields are the fields of a findAndModify command the proxy
// reads or carries; the generic arguments (lsid, writeConcern, ...) are
// carried as an update's.
var findAndModifyFields = map[string]bool{
	"query": true, "sort": true, "remove": true, "update": true, "new": true, "fields": true,
	"upsert": true, "bypassDocumentValidation": true, "collation": true, "arrayFilters": true,
	"hint": true, "let": true,
}

// fam is a parsed findAndModify.
type fam struct {
	req    *Request
	remove bool
	new    bool
	fields bsoncore.Document
}

// FindAndModify plans findAndModify on a bucketed namespace: the one
// event its query matches first is updated (or replaced, or removed) as
// an update statement would do it, and the reply carries that event as
// it was, or as it is with new: true, projected by fields. An upsert that
// matched nothing inserts and returns its new event (with new: true).
// Unlike update's, a failure is the command's error.
func FindAndModify(cmd rewrite.Command, rule *rules.Rule, env Env) rewrite.Plan {
	f, err := parseFindAndModify(cmd, rule, env)
	if err != nil {
		return rewrite.Fail(err)
	}
	if len(rule.Rollups) > 0 {
		return rewrite.Fail(query.RuleErrorf(rule, mongoerr.NotImplemented, "findAndModify is not supported on a rule with rollups (its rollups would no longer count its events)"))
	}
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		u := &updater{x: x, req: f.req, env: env, now: env.Now(), images: &images{}}
		if err := u.openJournal(); err != nil {
			return rewrite.Result{}, err
		}
		if u.jr.reply != nil {
			return rewrite.Result{Reply: u.jr.reply}, nil
		}
		st := f.req.Statements[0]
		st.remove = f.remove
		err := st.Err
		if err == nil {
			err = u.statement(st)
		}
		if err != nil {
			return rewrite.Result{}, err
		}
		reply := f.reply(u)
		if err := u.recordReply(reply); err != nil {
			return rewrite.Result{}, err
		}
		return rewrite.Result{Reply: reply}, nil
	})
}

// parseFindAndModify checks the command as MongoDB does and makes it a
// one-statement update request.
func parseFindAndModify(cmd rewrite.Command, rule *rules.Rule, env Env) (*fam, error) {
	body := cmd.Body
	f := &fam{}
	var err error
	if f.remove, err = bsonutil.Bool(body, "remove", false); err != nil {
		return nil, err
	}
	if f.new, err = bsonutil.Bool(body, "new", false); err != nil {
		return nil, err
	}
	upsert, err := bsonutil.Bool(body, "upsert", false)
	if err != nil {
		return nil, err
	}
	u, hasUpdate := bsonutil.Lookup(body, "update")
	switch {
	case f.remove && hasUpdate:
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Cannot specify both an update and remove=true")
	case f.remove && upsert:
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Cannot specify both upsert=true and remove=true ")
	case f.remove && f.new:
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document")
	case !f.remove && !hasUpdate:
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Either an update or remove=true must be specified")
	}
	if v, ok := bsonutil.Lookup(body, "fields"); ok && v.Type != bsoncore.TypeNull {
		if f.fields, ok = v.DocumentOK(); !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'findAndModify.fields' is the wrong type '%s', expected type 'object'", bsonutil.TypeName(v.Type))
		}
		if _, err := agg.Compile(projectStage(f.fields), agg.Options{}); err != nil {
			return nil, err
		}
	}
	var sortSpec bsoncore.Document
	if v, ok := bsonutil.Lookup(body, "sort"); ok && v.Type != bsoncore.TypeNull {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'findAndModify.sort' is the wrong type '%s', expected type 'object'", bsonutil.TypeName(v.Type))
		}
		if err := checkSort(d); err != nil {
			return nil, err
		}
		if !emptyDocument(d) {
			sortSpec = d
		}
	}
	stmt := bsoncore.NewDocumentBuilder()
	if q, ok := bsonutil.Lookup(body, "query"); ok && q.Type != bsoncore.TypeNull {
		stmt.AppendValue("q", q)
	} else {
		stmt.AppendDocument("q", bsoncore.NewDocumentBuilder().Build())
	}
	if hasUpdate {
		stmt.AppendValue("u", u)
	} else {
		// A remove: the statement's update is never applied.
		stmt.AppendDocument("u", bsoncore.NewDocumentBuilder().Build())
	}
	stmt.AppendBoolean("upsert", upsert)
	for _, name := range []string{"collation", "arrayFilters", "hint"} {
		if v, ok := bsonutil.Lookup(body, name); ok {
			stmt.AppendValue(name, v)
		}
	}
	if sortSpec != nil {
		// Every match is read, to update the first in sort order.
		stmt.AppendBoolean("multi", true)
	}
	f.req, err = NewRequest(rewrite.Command{Body: asUpdate(body, stmt.Build())}, rule, env.Caps)
	if err == nil && sortSpec != nil {
		st := f.req.Statements[0]
		st.sort, st.Multi = sortSpec, false
		if st.Err != nil && strings.Contains(st.Err.Error(), "multi update is not supported for replacement-style") {
			st.Err = nil // the statement is not a multi update: one event is replaced
		}
	}
	return f, err
}

// checkSort refuses a sort MongoDB refuses: each value 1 or -1.
func checkSort(d bsoncore.Document) error {
	elems, _ := d.Elements()
	for _, e := range elems {
		n, ok := e.Value().AsFloat64OK()
		if !ok || (n != 1 && n != -1) {
			return mongoerr.Errorf(mongoerr.BadValue, "$sort key ordering must be 1 (for ascending) or -1 (for descending): %s: %s", e.Key(), e.Value().String())
		}
	}
	return nil
}

// asUpdate is the update command of one statement that carries the
// findAndModify's target and generic arguments.
func asUpdate(body bsoncore.Document, stmt bsoncore.Document) bsoncore.Document {
	elems, _ := body.Elements()
	idx, d := bsoncore.AppendDocumentStart(nil)
	for i, e := range elems {
		switch {
		case i == 0:
			d = bsoncore.AppendValueElement(d, "update", e.Value())
		case findAndModifyFields[e.Key()] && e.Key() != "let":
		default:
			d = append(d, e...)
		}
	}
	aidx, a := bsoncore.AppendArrayElementStart(d, "updates")
	a = bsoncore.AppendDocumentElement(a, "0", stmt)
	d, _ = bsoncore.AppendArrayEnd(a, aidx)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func projectStage(fields bsoncore.Document) []agg.Stage {
	return []agg.Stage{{Name: "$project", Value: bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: fields}}}
}

// reply is findAndModify's: {lastErrorObject: {n, updatedExisting,
// upserted?}, value, ok: 1}.
func (f *fam) reply(u *updater) []byte {
	img := u.images
	n := int32(0)
	if img.before != nil || img.after != nil {
		n = 1
	}
	value := img.before
	if f.new && img.after != nil {
		value = img.after
	}
	if value != nil && f.fields != nil {
		value = project(value, f.fields)
	}
	leo := bsoncore.NewDocumentBuilder().AppendInt32("n", n)
	if !f.remove {
		leo.AppendBoolean("updatedExisting", img.before != nil)
		if len(u.out.upserted) > 0 {
			leo.AppendValue("upserted", u.out.upserted[0].id)
		}
	}
	b := bsoncore.NewDocumentBuilder().AppendDocument("lastErrorObject", leo.Build())
	if value != nil {
		b.AppendDocument("value", value)
	} else {
		b.AppendNull("value")
	}
	if wce := f.req.find.WriteConcernError(); wce.Type != 0 {
		b.AppendValue("writeConcernError", wce)
	}
	return b.AppendDouble("ok", 1).Build()
}

// project applies findAndModify's fields to the event it returns.
func project(doc, fields bsoncore.Document) bsoncore.Document {
	p, err := agg.Compile(projectStage(fields), agg.Options{})
	if err != nil || p.Push(doc) != nil {
		return doc
	}
	out, err := p.Finish()
	if err != nil || len(out) != 1 {
		return doc
	}
	return out[0]
}

// images are the event a findAndModify changed, before and after.
type images struct {
	before, after bsoncore.Document
}

func emptyDocument(d bsoncore.Document) bool {
	elems, err := d.Elements()
	return err == nil && len(elems) == 0
}
