package fanout

import (
	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
)

// MergedCursor is the proxy-held cursor over a find merged across
// partitions.
type MergedCursor struct {
	id int64
	f  *FindMerge
}

// NewMergedCursor holds the rest of f's merged result under id.
func NewMergedCursor(id int64, f *FindMerge) *MergedCursor {
	return &MergedCursor{id: id, f: f}
}

// ID is the id the client knows the cursor by.
func (c *MergedCursor) ID() int64 { return c.id }

// Local: the proxy holds every document of the result.
func (c *MergedCursor) Local() bool { return true }

// More answers a getMore from the merged documents held; a getMore
// without batchSize (or 0) takes as many as fit.
func (c *MergedCursor) More(body []byte) rewrite.Plan {
	n, ok := cursor.GetMoreBatchSize(body)
	if !ok || n == 0 {
		n = -1
	}
	reply, more := c.f.Batch(c.id, n)
	res := rewrite.Result{Reply: reply}
	if more {
		res.Cursor = c
	}
	return rewrite.Done(res)
}

// Close releases nothing upstream.
func (c *MergedCursor) Close() rewrite.Plan { return nil }
