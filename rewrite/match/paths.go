package match

import "go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

// ArrayOnPath reports whether path reaches into, or ends at, an array in
// doc. MongoDB sorts arrays by their least or greatest element; the
// proxy's sort does not, so such an event is refused rather than
// misplaced (its filter matches arrays element-wise).
func ArrayOnPath(doc bsoncore.Document, path []string) bool {
	for i := range path {
		v, err := doc.LookupErr(path[:i+1]...)
		if err != nil {
			return false
		}
		if v.Type == bsoncore.TypeArray {
			return true
		}
		if v.Type != bsoncore.TypeEmbeddedDocument {
			return false
		}
	}
	return false
}
