package deletes

import (
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The delete options MongoDB takes that a bucketed delete honours
// without an equivalent upstream: let (variables only $expr reads),
// collation (only string comparisons use it) and $jsonSchema's argument
// checks.

// checkLet reads the delete's let: a document (or null, as absent).
// Its variables are only read by $expr, which a bucketed delete filter
// refuses by name, so a filter that can run does not use them.
func checkLet(body bsoncore.Document) error {
	v, ok := bsonutil.Lookup(body, "let")
	if !ok || v.Type == bsoncore.TypeNull || v.Type == bsoncore.TypeEmbeddedDocument {
		return nil
	}
	return mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'delete.let' is the wrong type '%s', expected type 'object'", bsonutil.TypeName(v.Type))
}

// collationFields are the fields of MongoDB's collation document.
var collationFields = map[string]bool{
	"locale": true, "caseLevel": true, "caseFirst": true, "strength": true, "numericOrdering": true,
	"alternate": true, "maxVariable": true, "normalization": true, "backwards": true, "version": true,
}

// statementCollation reads a delete statement's collation: whether it is
// MongoDB's simple collation (bytewise string comparison, the only one a
// bucketed filter runs), or MongoDB's parse error for a collation that
// is not a document, has no locale or has an unknown field.
func statementCollation(i int, v bsoncore.Value) (simple bool, err error) {
	if v.Type == bsoncore.TypeNull {
		return true, nil
	}
	doc, ok := v.DocumentOK()
	if !ok {
		return false, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'delete.deletes.collation' is the wrong type '%s', expected type 'object' (statement %d)", bsonutil.TypeName(v.Type), i)
	}
	elems, err := doc.Elements()
	if err != nil {
		return false, mongoerr.Errorf(mongoerr.InvalidBSON, "delete statement %d: collation is not valid BSON", i)
	}
	locale, hasLocale := "", false
	for _, e := range elems {
		if !collationFields[e.Key()] {
			return false, mongoerr.Errorf(mongoerr.IDLUnknownField, "BSON field 'collation.%s' is an unknown field.", e.Key())
		}
		if e.Key() != "locale" {
			continue
		}
		if locale, hasLocale = e.Value().StringValueOK(); !hasLocale {
			return false, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'collation.locale' is the wrong type '%s', expected type 'string'", bsonutil.TypeName(e.Value().Type))
		}
	}
	if !hasLocale {
		return false, mongoerr.Errorf(mongoerr.IDLFailedToParse, "BSON field 'collation.locale' is missing but a required field")
	}
	return locale == "simple", nil
}

// collationRefusal is the statement error of a collation other than
// simple on a filter that compares strings: the bucketed filter compares
// them bytewise. A filter that compares no string gives the same answer
// under any collation, and runs.
func collationRefusal(rule *rules.Rule, filter bsoncore.Document) error {
	if !comparesStrings(bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: filter}) {
		return nil
	}
	return query.RuleErrorf(rule, mongoerr.NotImplemented, "delete with a collation other than {locale: \"simple\"} on a filter that compares strings is not supported on a bucketed namespace (strings compare bytewise there); remove the collation or compare no strings")
}

// operandsWithoutComparison are the operators whose string operands are
// no compared values: a pattern, its options, a type name, a geometry.
var operandsWithoutComparison = map[string]bool{
	"$regex": true, "$options": true, "$type": true, "$exists": true, "$size": true, "$mod": true,
	"$bitsAllSet": true, "$bitsAllClear": true, "$bitsAnySet": true, "$bitsAnyClear": true,
	"$comment": true, "$jsonSchema": true,
}

// comparesStrings reports whether a filter value holds a string a
// comparison would use (or a symbol, which compares as one).
func comparesStrings(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeString, bsoncore.TypeSymbol:
		return true
	case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
		elems, err := bsoncore.Document(v.Data).Elements()
		if err != nil {
			return true // unreadable: assume the worst
		}
		for _, e := range elems {
			if operandsWithoutComparison[e.Key()] {
				continue
			}
			if comparesStrings(e.Value()) {
				return true
			}
		}
	}
	return false
}

// jsonSchemaKeywords are the keywords MongoDB's $jsonSchema takes;
// jsonSchemaUnsupported those it names and refuses.
var (
	jsonSchemaKeywords = map[string]bool{
		"additionalItems": true, "additionalProperties": true, "allOf": true, "anyOf": true, "bsonType": true,
		"dependencies": true, "description": true, "encrypt": true, "encryptMetadata": true, "enum": true,
		"exclusiveMaximum": true, "exclusiveMinimum": true, "items": true, "maxItems": true, "maxLength": true,
		"maxProperties": true, "maximum": true, "minItems": true, "minLength": true, "minProperties": true,
		"minimum": true, "multipleOf": true, "not": true, "oneOf": true, "pattern": true,
		"patternProperties": true, "properties": true, "required": true, "title": true, "type": true,
		"uniqueItems": true,
	}
	jsonSchemaUnsupported = map[string]bool{
		"$ref": true, "$schema": true, "default": true, "definitions": true, "format": true, "id": true,
	}
)

// jsonSchemaError is MongoDB's parse error for a $jsonSchema of filter
// (at its top level or under $and, $or and $nor, where MongoDB takes
// it) whose argument is not a document or names an unknown or
// unsupported keyword; nil otherwise. A valid schema is still refused
// by the filter's translation.
func jsonSchemaError(filter bsoncore.Document) error {
	elems, err := filter.Elements()
	if err != nil {
		return nil // the filter's translation reports it
	}
	for _, e := range elems {
		switch e.Key() {
		case "$jsonSchema":
			if err := checkJSONSchema(e.Value()); err != nil {
				return err
			}
		case "$and", "$or", "$nor":
			arr, ok := e.Value().ArrayOK()
			if !ok {
				continue
			}
			vals, _ := arr.Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					if err := jsonSchemaError(d); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// checkJSONSchema checks one $jsonSchema argument's type and keywords.
func checkJSONSchema(v bsoncore.Value) error {
	schema, ok := v.DocumentOK()
	if !ok {
		return mongoerr.Errorf(mongoerr.TypeMismatch, "$jsonSchema must be an object")
	}
	elems, _ := schema.Elements()
	for _, e := range elems {
		switch k := e.Key(); {
		case jsonSchemaUnsupported[k]:
			return mongoerr.Errorf(mongoerr.FailedToParse, "$jsonSchema keyword '%s' is not currently supported", k)
		case !jsonSchemaKeywords[k]:
			return mongoerr.Errorf(mongoerr.FailedToParse, "Unknown $jsonSchema keyword: %s", k)
		}
	}
	return nil
}
