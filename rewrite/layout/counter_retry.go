package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MarkerLife is how long a counter write's mark is guaranteed to stay in
// its buckets: the latest a retry of it can be checked.
const MarkerLife = 10 * time.Second

// CounterApplied is the field holding the marks.
const CounterApplied = "applied"

// CounterOptions are the inputs of CounterInsertWith.
type CounterOptions struct {
	Caps caps.Upstream
	// WriteID marks each upsert (see CounterWriteID); "" for none.
	WriteID string
	// Now is the proxy's clock (Unix ms), which picks the mark's period.
	Now int64
	// Applied says a bucket holds WriteID's mark already: its statement
	// was applied by an earlier attempt of this write.
	Applied func(id [12]byte) bool
	// mergeMark marks each upsert with the staging collection a merge
	// counts (CounterMerged) instead of WriteID's mark.
	mergeMark string
	// Before, when set, returns the stored bucket of a key (whole; nil
	// for none): read where the upstream packs the slots
	// (Caps.PackedEvents), whose buckets are written whole.
	Before func(bucket.Key) bsoncore.Document
}

// CounterWriteID is the id of a retryable insert an upstream with caps
// cannot recognise as a retry: a hash of its lsid and txnNumber. It is ""
// when the insert is not retryable or the upstream recognises retries.
func CounterWriteID(cmd rewrite.Command, caps caps.Upstream) string {
	if !insert.MayBeUnseenRetry(cmd, caps) {
		return ""
	}
	lsid, ok := bsonutil.Lookup(cmd.Body, "lsid")
	txn, tok := bsonutil.Lookup(cmd.Body, "txnNumber")
	n, nok := txn.AsInt64OK()
	if !ok || !tok || !nok {
		return ""
	}
	h := sha256.New()
	h.Write([]byte{byte(lsid.Type)})
	h.Write(lsid.Data)
	h.Write([]byte(strconv.FormatInt(n, 10)))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// appendMark adds the $set of the write's mark and the $unset of the
// marks two periods old to an update document being built.
func appendMark(u []byte, writeID string, now int64) []byte {
	gen := markGen(now)
	si, u := bsoncore.AppendDocumentElementStart(u, "$set")
	u = bsoncore.AppendBooleanElement(u, CounterApplied+".g"+strconv.FormatInt(gen%3, 10)+"."+writeID, true)
	u, _ = bsoncore.AppendDocumentEnd(u, si)
	ui, u := bsoncore.AppendDocumentElementStart(u, "$unset")
	u = bsoncore.AppendStringElement(u, CounterApplied+".g"+strconv.FormatInt((gen+1)%3, 10), "")
	u, _ = bsoncore.AppendDocumentEnd(u, ui)
	return u
}

// markGen is the period of MarkerLife that now (Unix ms) falls in.
func markGen(now int64) int64 {
	gen := now / MarkerLife.Milliseconds()
	if gen < 0 {
		gen = -gen
	}
	return gen
}

// CounterHasMark reports whether a stored counter bucket holds the mark
// of writeID.
func CounterHasMark(bdoc bsoncore.Document, writeID string) bool {
	marks, ok := bdoc.Lookup(CounterApplied).DocumentOK()
	if !ok || writeID == "" {
		return false
	}
	gens, _ := marks.Elements()
	for _, g := range gens {
		d, ok := g.Value().DocumentOK()
		if !ok {
			continue
		}
		if v, err := d.LookupErr(writeID); err == nil && v.Boolean() {
			return true
		}
	}
	return false
}

// CounterMarkFetch is the point lookup of a bucket's marks.
func CounterMarkFetch(bucketColl, db string, id [12]byte) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().
		AppendString("find", bucketColl).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendObjectID("_id", id).Build()).
		AppendDocument("projection", bsoncore.NewDocumentBuilder().AppendInt32(CounterApplied, 1).Build()).
		AppendBoolean("singleBatch", true).
		AppendString("$db", db).
		Build()
}

// CounterRetryTooLate is the error of a retried counter insert that came
// later than its marks are guaranteed to last: whether its first attempt
// was counted cannot be told, so it is not counted again.
func CounterRetryTooLate(rule string, age time.Duration) error {
	return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: a retried counter insert came %v after its first attempt, later than the proxy can tell whether that attempt was counted (%v); it was not counted again",
		rule, age.Round(time.Millisecond), MarkerLife)
}
