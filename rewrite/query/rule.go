package query

import (
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func RuleErrorf(rule *rules.Rule, code mongoerr.Code, format string, args ...any) error {
	return mongoerr.Errorf(code, "tsproxy rule %s: %s", rule.Namespace, fmt.Sprintf(format, args...))
}

// CheckTarget makes sure the command names the rule's collection.
func CheckTarget(body bsoncore.Document, rule *rules.Rule, name string) error {
	elems, err := body.Elements()
	if err != nil || len(elems) == 0 {
		return mongoerr.Errorf(mongoerr.BadValue, "empty command")
	}
	if elems[0].Key() != name {
		return mongoerr.Errorf(mongoerr.BadValue, "not a %s command: %q", name, elems[0].Key())
	}
	coll, ok := elems[0].Value().StringValueOK()
	if !ok {
		return mongoerr.Errorf(mongoerr.TypeMismatch, "collection name must be a string, got %s", bsonutil.TypeName(elems[0].Value().Type))
	}
	if coll != rule.Collection {
		return mongoerr.Errorf(mongoerr.BadValue, "%s on collection %q does not match the rule's collection %q", name, coll, rule.Collection)
	}
	if v, ok := bsonutil.Lookup(body, "$db"); ok {
		if db, ok := v.StringValueOK(); !ok || db != rule.DB {
			return mongoerr.Errorf(mongoerr.BadValue, "$db %s does not match the rule's database %q", v.String(), rule.DB)
		}
	}
	return nil
}
