package updateop

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// arrayFilters match array elements for the $[<identifier>] components
// of an update's paths, by identifier.
type arrayFilters map[string]func(elem any) bool

// positional reads a path component $[] (id "") or $[<identifier>];
// false for any other.
func positional(p string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(p, "$[")
	if !ok {
		return "", false
	}
	id, ok = strings.CutSuffix(rest, "]")
	if !ok {
		return "", false
	}
	return id, id == "" || validIdentifier(id)
}

// validIdentifier: an alphanumeric name beginning with a lowercase
// letter, as MongoDB requires of array filter identifiers.
func validIdentifier(id string) bool {
	for i, r := range id {
		switch {
		case r >= 'a' && r <= 'z':
		case i > 0 && (r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'):
		default:
			return false
		}
	}
	return id != ""
}

// parseArrayFilters compiles a statement's arrayFilters: each document
// names one identifier in all its top-level fields ({x: cond} or
// {"x.f": cond}) and matches an element e as a query on {x: e}.
func parseArrayFilters(v bsoncore.Value) (arrayFilters, error) {
	if v.Type == 0 || v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "BSON field 'update.updates.arrayFilters' is the wrong type '%s', expected type 'array'", bsonutil.TypeName(v.Type))
	}
	vals, _ := arr.Values()
	af := arrayFilters{}
	for _, fv := range vals {
		f, ok := fv.DocumentOK()
		if !ok {
			return nil, mongoerr.Errorf(mongoerr.TypeMismatch, "Each array filter must be an object, found %s", bsonutil.TypeName(fv.Type))
		}
		elems, _ := f.Elements()
		if len(elems) == 0 {
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Cannot use an expression without a top-level field name in arrayFilters")
		}
		id := ""
		for _, e := range elems {
			name, _, _ := strings.Cut(e.Key(), ".")
			if !validIdentifier(name) {
				return nil, mongoerr.Errorf(mongoerr.BadValue, "Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric string beginning with a lowercase letter, found '%s'", name)
			}
			if id != "" && name != id {
				return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Error parsing array filter :: caused by :: Expected a single top-level field name, found '%s' and '%s'", id, name)
			}
			id = name
		}
		if _, dup := af[id]; dup {
			return nil, mongoerr.Errorf(mongoerr.FailedToParse, "Found multiple array filters with the same top-level field name %s", id)
		}
		fc := &match.Compiler{Unsupported: func(format string, args ...any) error {
			return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy: array filter: "+format, args...)
		}}
		pred, err := fc.Compile(append(bsoncore.Document(nil), f...), 0)
		if err != nil {
			return nil, err
		}
		af[id] = func(e any) bool {
			doc, err := bson.Marshal(bson.D{{Key: id, Value: e}})
			return err == nil && pred(doc)
		}
	}
	return af, nil
}

// useFilters gives the update's operators its array filters, and refuses
// an identifier no filter names or a filter no path uses, as MongoDB
// does.
func (u *Update) useFilters(af arrayFilters) error {
	used := map[string]bool{}
	for i := range u.ops {
		u.ops[i].af = af
		for _, p := range append(slicesOf(u.ops[i].path), u.ops[i].from...) {
			id, ok := positional(p)
			if !ok || id == "" {
				continue
			}
			if af[id] == nil {
				return mongoerr.Errorf(mongoerr.BadValue, "No array filter found for identifier '%s' in path '%s'", id, u.ops[i].dotted)
			}
			used[id] = true
		}
		if u.ops[i].name == "$rename" && hasPositional(u.ops[i].path, u.ops[i].from) {
			return mongoerr.Errorf(mongoerr.BadValue, "The source field for $rename may not be dynamic: %s", u.ops[i].fromDotted)
		}
	}
	for id := range af {
		if !used[id] {
			return mongoerr.Errorf(mongoerr.FailedToParse, "%s", fmt.Sprintf("The array filter for identifier '%s' was not used in the update", id))
		}
	}
	return nil
}

func slicesOf(p []string) []string { return append([]string(nil), p...) }

func hasPositional(paths ...[]string) bool {
	for _, p := range paths {
		for _, c := range p {
			if _, ok := positional(c); ok {
				return true
			}
		}
	}
	return false
}
