package query

import (
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ArrayOnPath reports whether path reaches into, or ends at, an array in
// doc. MongoDB matches and sorts arrays element-wise; the proxy's filter
// and sort do not, so such an event is refused rather than misplaced.
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

// FilterPaths lists the field paths a filter names.
func FilterPaths(f bsoncore.Document, depth int, out [][]string) [][]string {
	if depth > bsonutil.MaxDepth {
		return out
	}
	elems, _ := f.Elements()
	for _, e := range elems {
		switch k := e.Key(); {
		case k == "$and" || k == "$or" || k == "$nor":
			arr, _ := e.Value().ArrayOK()
			vals, _ := arr.Values()
			for _, v := range vals {
				if d, ok := v.DocumentOK(); ok {
					out = FilterPaths(d, depth+1, out)
				}
			}
		case !strings.HasPrefix(k, "$"):
			out = append(out, strings.Split(k, "."))
		}
	}
	return out
}
