package proxy

import (
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read"
	"github.com/tsproxy/tsproxy/rules"
)

// A scan read (read.PointRead with a bucket scan source) holds an
// upstream cursor on the bucket collection while the proxy's own cursor
// lives. FerretDB v1.24 keeps cursors until they are killed, so the proxy
// kills it whenever its cursor ends first: a limit reached, a single
// batch, an error, killCursors, or the client connection closing.

// closeScan kills the upstream cursor pr still holds open, if any; a
// failure only leaves it to the upstream.
func (c *conn) closeScan(rule *rules.Rule, pr *read.PointRead) {
	id := pr.OpenUpstreamCursor()
	if id == 0 {
		return
	}
	pr.UpstreamCursorClosed()
	if _, err := c.upCommand(query.KillCursorsCommand(rule, id)); err != nil {
		c.log.Debug("killCursors of a bucket scan's upstream cursor failed", "rule", rule.Namespace, "cursor", id, "err", err.Error())
	}
}

// closeScanEntry is closeScan for a registry entry being forgotten.
func (c *conn) closeScanEntry(e *cursorEntry) {
	if e == nil {
		return
	}
	if pc, ok := e.reshape.(*pointCursor); ok {
		// A getMore of the cursor on another connection finishes first.
		pc.mu.Lock()
		defer pc.mu.Unlock()
		c.closeScan(e.rule, pc.pr)
	}
}
