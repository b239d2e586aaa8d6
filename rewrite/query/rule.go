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

// CheckTarget makes sure body is a name command on the rule's
// collection (and database, when it names one), so that a routing
// mistake cannot read or write one namespace's buckets for another.
// Only the first element is read for the name: Elements would make a
// slice of them all, on every insert.
func CheckTarget(body bsoncore.Document, rule *rules.Rule, name string) error {
	first, err := body.IndexErr(0)
	if err != nil || first.Validate() != nil {
		return mongoerr.Errorf(mongoerr.BadValue, "empty command")
	}
	if string(first.KeyBytes()) != name {
		return mongoerr.Errorf(mongoerr.BadValue, "the command is %q, not %s", first.Key(), name)
	}
	coll, ok := first.Value().StringValueOK()
	if !ok {
		return mongoerr.Errorf(mongoerr.TypeMismatch, "collection name must be a string, got %s", bsonutil.TypeName(first.Value().Type))
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
