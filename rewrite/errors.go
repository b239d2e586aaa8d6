package rewrite

import (
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// writeError is one entry of a reply's writeErrors: index is the position
// of the event in the app's own batch.
type writeError struct {
	index  int
	code   mongoerr.Code
	errmsg string
}
