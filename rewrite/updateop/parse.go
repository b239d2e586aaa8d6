package updateop

import (
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/agg"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/join"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Kind is what an update statement's u is.
type Kind int

const (
	// Replacement: a document of fields, which becomes the document
	// (its _id kept).
	Replacement Kind = iota
	// Operators: a document of update operators.
	Operators
	// Pipeline: an array of aggregation stages.
	Pipeline
)

// Update is one parsed update (a statement's u).
type Update struct {
	kind        Kind
	replacement bson.D
	ops         []op
	pipeline    []agg.Stage
}

// Bind gives a pipeline update the values of its let variables (the
// command's let and the statement's c); the other kinds use none.
func (u *Update) Bind(vars map[string]bsoncore.Value) error {
	if u.kind != Pipeline {
		return nil
	}
	bound, err := join.BindStages(u.pipeline, vars)
	if err != nil {
		return err
	}
	if _, err := agg.Compile(bound, agg.Options{}); err != nil {
		return err
	}
	u.pipeline = bound
	return nil
}

// Touches says whether the update may change field (a top-level name):
// a replacement or a pipeline may change any.
func (u *Update) Touches(field string) bool {
	if u.kind != Operators {
		return true
	}
	for _, o := range u.ops {
		if o.path[0] == field || (o.from != nil && o.from[0] == field) {
			return true
		}
	}
	return false
}

// Kind says what u was.
func (u *Update) Kind() Kind { return u.kind }

// op is one field of one operator: {$inc: {a: 1, b: 2}} is two.
type op struct {
	name   string
	path   []string
	dotted string
	arg    any
	// from is $rename's source (path is its target).
	from       []string
	fromDotted string
	// af are the update's array filters, by identifier.
	af arrayFilters
}

// operators are the update operators MongoDB has, each applying to the
// field it names.
var operators = map[string]bool{
	"$set": true, "$unset": true, "$inc": true, "$mul": true, "$min": true, "$max": true,
	"$rename": true, "$currentDate": true, "$setOnInsert": true,
	"$push": true, "$addToSet": true, "$pop": true, "$pull": true, "$pullAll": true, "$bit": true,
}

// pipelineStages are the stages an update pipeline may hold (MongoDB's
// list).
var pipelineStages = map[string]bool{
	"$addFields": true, "$set": true, "$project": true, "$unset": true, "$replaceRoot": true, "$replaceWith": true,
}

// Parse reads a statement's u: a replacement, a document of operators,
// or a pipeline. Errors are MongoDB's for the same u.
func Parse(u bsoncore.Value) (*Update, error) { return ParseWithFilters(u, bsoncore.Value{}) }

// ParseWithFilters is Parse with the statement's arrayFilters (Type 0:
// none), which the $[<identifier>] components of its paths name.
func ParseWithFilters(u bsoncore.Value, filters bsoncore.Value) (*Update, error) {
	af, err := parseArrayFilters(filters)
	if err != nil {
		return nil, err
	}
	up, err := parse(u)
	if err != nil {
		return nil, err
	}
	if len(af) > 0 && up.kind != Operators {
		return nil, mongoerr.Errorf(mongoerr.FailedToParse, "arrayFilters may not be specified for pipeline-style or replacement-style updates")
	}
	return up, up.useFilters(af)
}

func parse(u bsoncore.Value) (*Update, error) {
	switch u.Type {
	case bsoncore.TypeArray:
		return parsePipeline(u.Array())
	case bsoncore.TypeEmbeddedDocument:
	default:
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "Update argument must be either an object or an array, got %s", bsonutil.TypeName(u.Type))
	}
	doc := u.Document()
	elems, err := doc.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "update: %v", err)
	}
	if len(elems) == 0 || !strings.HasPrefix(elems[0].Key(), "$") {
		return parseReplacement(doc, elems)
	}
	return parseOperators(elems)
}

func parseReplacement(doc bsoncore.Document, elems []bsoncore.Element) (*Update, error) {
	for _, e := range elems {
		if strings.HasPrefix(e.Key(), "$") {
			return nil, mongoerr.Errorf(mongoerr.DollarPrefixedFieldName, "The dollar ($) prefixed field '%s' in '%s' is not allowed in the context of an update's replacement document. Consider using an aggregation pipeline with $replaceWith.", e.Key(), e.Key())
		}
	}
	var d bson.D
	if err := bson.Unmarshal(doc, &d); err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "update: %v", err)
	}
	return &Update{kind: Replacement, replacement: d}, nil
}

func parseOperators(elems []bsoncore.Element) (*Update, error) {
	u := &Update{kind: Operators}
	for _, e := range elems {
		name := e.Key()
		if !operators[name] {
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Unknown modifier: %s. Expected a valid update modifier or pipeline-style update specified as an array", name)
		}
		fields, ok := e.Value().DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Modifiers operate on fields but we found type %s instead. For example: {$mod: {<field>: ...}} not {%s: %s}", bsonutil.TypeName(e.Value().Type), name, e.Value().String())
		}
		var d bson.D
		if err := bson.Unmarshal(fields, &d); err != nil {
			return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "update: %v", err)
		}
		for _, f := range d {
			o, err := newOp(name, f.Key, f.Value)
			if err != nil {
				return nil, err
			}
			u.ops = append(u.ops, o)
		}
	}
	if err := checkConflicts(u.ops); err != nil {
		return nil, err
	}
	// MongoDB 5.0+ applies the fields in lexicographic order.
	slices.SortStableFunc(u.ops, func(a, b op) int { return comparePaths(a.path, b.path) })
	return u, nil
}

// comparePaths orders paths as MongoDB applies them: field by field.
func comparePaths(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if c := strings.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return len(a) - len(b)
}

func newOp(name, field string, arg any) (op, error) {
	path, err := splitPath(field)
	if err != nil {
		return op{}, err
	}
	o := op{name: name, path: path, dotted: field, arg: arg}
	if name == "$rename" {
		to, ok := arg.(string)
		if !ok {
			return op{}, mongoerr.Errorf(mongoerr.BadValue, "The 'to' field for $rename must be a string: %s: %v", field, arg)
		}
		if to == field {
			return op{}, mongoerr.Errorf(mongoerr.BadValue, "The source and target field for $rename must differ: %s: %q", field, to)
		}
		target, err := splitPath(to)
		if err != nil {
			return op{}, err
		}
		if isPrefix(path, target) || isPrefix(target, path) {
			return op{}, mongoerr.Errorf(mongoerr.BadValue, "The source and target field for $rename must not be on the same path: %s: %q", field, to)
		}
		o.from, o.fromDotted = path, field
		o.path, o.dotted = target, to
	}
	return o, checkArg(o)
}

// splitPath splits a dotted field path; empty names and positional
// operators are refused.
func splitPath(field string) ([]string, error) {
	if field == "" {
		return nil, mongoerr.Errorf(mongoerr.EmptyFieldName, "An empty update path is not valid.")
	}
	parts := strings.Split(field, ".")
	for _, p := range parts {
		switch {
		case p == "":
			return nil, mongoerr.Errorf(mongoerr.EmptyFieldName, "The update path '%s' contains an empty field name, which is not allowed.", field)
		case p == "$":
			return nil, mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy: the positional operator %q (in %q) is not supported in updates of a time-series collection; $[] and $[<identifier>] are", p, field)
		case strings.HasPrefix(p, "$["):
			if _, ok := positional(p); !ok {
				return nil, mongoerr.Errorf(mongoerr.BadValue, "Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric string beginning with a lowercase letter, found '%s'", strings.TrimSuffix(strings.TrimPrefix(p, "$["), "]"))
			}
		case strings.HasPrefix(p, "$"):
			return nil, mongoerr.Errorf(mongoerr.DollarPrefixedFieldName, "The dollar ($) prefixed field '%s' in '%s' is not valid for storage.", p, field)
		}
	}
	return parts, nil
}

func isPrefix(a, b []string) bool {
	return len(a) <= len(b) && slices.Equal(a, b[:len(a)])
}

// checkConflicts refuses two operators on one path, or on a path and a
// path inside it, as MongoDB does.
func checkConflicts(ops []op) error {
	type named struct {
		path   []string
		dotted string
	}
	var all []named
	for _, o := range ops {
		all = append(all, named{o.path, o.dotted})
		if o.from != nil {
			all = append(all, named{o.from, o.fromDotted})
		}
	}
	for i := range all {
		for j := range i {
			a, b := all[j], all[i]
			if isPrefix(a.path, b.path) {
				return mongoerr.Errorf(mongoerr.ConflictingUpdateOperators, "Updating the path '%s' would create a conflict at '%s'", b.dotted, a.dotted)
			}
			if isPrefix(b.path, a.path) {
				return mongoerr.Errorf(mongoerr.ConflictingUpdateOperators, "Updating the path '%s' would create a conflict at '%s'", b.dotted, b.dotted)
			}
		}
	}
	return nil
}

// checkArg refuses an operator's argument as MongoDB's parser does.
func checkArg(o op) error {
	switch o.name {
	case "$inc", "$mul":
		if !isNumber(o.arg) {
			verb := map[string]string{"$inc": "increment", "$mul": "multiply"}[o.name]
			return mongoerr.Errorf(mongoerr.TypeMismatch, "Cannot %s with non-numeric argument: {%s: %s}", verb, o.dotted, show(o.arg))
		}
	case "$pop":
		n, ok := toFloat(o.arg)
		if !ok {
			return mongoerr.Errorf(mongoerr.TypeMismatch, "Expected a number in: %s: %s", o.dotted, show(o.arg))
		}
		if n != 1 && n != -1 {
			return mongoerr.Errorf(mongoerr.FailedToParse, "$pop expects 1 or -1, found: %s", show(o.arg))
		}
	case "$currentDate":
		switch a := o.arg.(type) {
		case bool:
		case bson.D:
			t, ok := lookupD(a, "$type")
			s, _ := t.(string)
			if !ok || len(a) != 1 || (s != "date" && s != "timestamp") {
				return mongoerr.Errorf(mongoerr.BadValue, "The '$type' string field is required to be 'date' or 'timestamp': {$currentDate: {%s: {$type: 'date'}}}", o.dotted)
			}
		default:
			return mongoerr.Errorf(mongoerr.BadValue, "%s is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({$type: 'timestamp/date'}).", typeName(o.arg))
		}
	case "$pullAll":
		if _, ok := o.arg.(bson.A); !ok {
			return mongoerr.Errorf(mongoerr.BadValue, "$pullAll requires an array argument but was given a %s", typeName(o.arg))
		}
	case "$bit":
		d, ok := o.arg.(bson.D)
		if !ok || len(d) == 0 {
			return mongoerr.Errorf(mongoerr.BadValue, "The $bit modifier is not compatible with a %s. You must pass in an embedded document: {$bit: {field: {and/or/xor: #}}", typeName(o.arg))
		}
		for _, e := range d {
			if e.Key != "and" && e.Key != "or" && e.Key != "xor" {
				return mongoerr.Errorf(mongoerr.BadValue, "The $bit modifier only supports 'and', 'or', and 'xor', not '%s' which is an unknown operator: {%s: %s}", e.Key, e.Key, show(e.Value))
			}
			switch e.Value.(type) {
			case int32, int64:
			default:
				return mongoerr.Errorf(mongoerr.BadValue, "The $bit modifier field must be an Integer(32/64 bit); a '%s' is not supported here: {%s: %s}", typeName(e.Value), e.Key, show(e.Value))
			}
		}
	case "$push", "$addToSet":
		return checkEach(o)
	}
	return nil
}

// checkEach checks the modifiers of $push and $addToSet.
func checkEach(o op) error {
	d, ok := o.arg.(bson.D)
	if !ok {
		return nil
	}
	each, ok := lookupD(d, "$each")
	if !ok {
		return nil // a document pushed as it is
	}
	if _, ok := each.(bson.A); !ok {
		return mongoerr.Errorf(mongoerr.BadValue, "The argument to $each in %s must be an array but it was of type: %s", o.name, typeName(each))
	}
	for _, e := range d {
		switch e.Key {
		case "$each":
		case "$slice", "$position":
			if o.name == "$addToSet" {
				return mongoerr.Errorf(mongoerr.BadValue, "Found unexpected fields after $each in $addToSet: %s", show(d))
			}
			if _, ok := toInt(e.Value); !ok {
				return mongoerr.Errorf(mongoerr.BadValue, "The value for %s must be an integer value but was given type: %s", e.Key, typeName(e.Value))
			}
		case "$sort":
			if o.name == "$addToSet" {
				return mongoerr.Errorf(mongoerr.BadValue, "Found unexpected fields after $each in $addToSet: %s", show(d))
			}
			if err := checkSortSpec(e.Value); err != nil {
				return err
			}
		default:
			return mongoerr.Errorf(mongoerr.BadValue, "Unrecognized clause in $push: %s", e.Key)
		}
	}
	return nil
}

func checkSortSpec(v any) error {
	if n, ok := toFloat(v); ok {
		if n != 1 && n != -1 {
			return mongoerr.Errorf(mongoerr.BadValue, "The $sort element value must be either 1 or -1")
		}
		return nil
	}
	d, ok := v.(bson.D)
	if !ok || len(d) == 0 {
		return mongoerr.Errorf(mongoerr.BadValue, "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields")
	}
	for _, e := range d {
		if n, ok := toFloat(e.Value); !ok || (n != 1 && n != -1) {
			return mongoerr.Errorf(mongoerr.BadValue, "The $sort element value must be either 1 or -1")
		}
	}
	return nil
}

func parsePipeline(arr bsoncore.Array) (*Update, error) {
	vals, err := arr.Values()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "update pipeline: %v", err)
	}
	u := &Update{kind: Pipeline}
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "Each element of the 'pipeline' array must be an object")
		}
		elems, _ := d.Elements()
		if len(elems) != 1 {
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "A pipeline stage specification object must contain exactly one field.")
		}
		name := elems[0].Key()
		if !pipelineStages[name] {
			return nil, mongoerr.Errorf(mongoerr.InvalidOptions, "%s is not allowed to be used within an update", name)
		}
		ev := elems[0].Value()
		u.pipeline = append(u.pipeline, agg.Stage{Name: name, Value: bsoncore.Value{Type: ev.Type, Data: slices.Clone(ev.Data)}})
	}
	// Compiled by Bind, once the let variables are known (an
	// expression's $$x is an error until then), or by Apply.
	return u, nil
}
