package caps

import "go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

// Upstream is what one upstream supports, detected once per upstream by the
// proxy (buildInfo: FerretDB answers with "ferretdbVersion").
type Upstream struct {
	// StmtIDs: the upstream accepts "stmtIds" on insert and update
	// (MongoDB does; FerretDB rejects the field). Only set it for an
	// upstream that also implements retryable writes: without stmtIds such
	// an upstream numbers the statements of each command from 0, and two
	// rewritten commands sharing one txnNumber would then look like
	// retries of each other.
	StmtIDs bool
	// FullAggregation: the upstream runs any aggregation stage, and
	// $replaceWith in particular (MongoDB 4.2+), so a bucketed aggregate
	// with stages the proxy cannot translate can run upstream on the
	// rebuilt events. FerretDB v1.24 cannot.
	FullAggregation bool
	// InexactSums: the upstream's $sum and $avg of doubles differ from
	// MongoDB's compensated summation in the last bits (DocumentDB under
	// FerretDB 2.x; admin.ExactSumsProbe finds it). The proxy then runs
	// an aggregation of events in its own engine rather than upstream
	// after the unwind, even where the upstream runs every stage.
	InexactSums bool
	// UnwindKeepsFields: $unwind keeps the other fields of the document
	// (MongoDB). FerretDB v1.24 keeps only _id and the unwound field, so
	// there the bucket's meta is looked up by bucket _id, and filters and
	// sorts that need it after the unwind are refused.
	UnwindKeepsFields bool
	// IDOnlyFilters: the upstream reads a document by index only when an
	// update's filter is exactly {_id: X}; any other filter scans (and
	// decodes) the whole collection per statement. FerretDB v1.24 with
	// SQLite is such an upstream. Bucket upserts then filter on _id alone
	// and rely on the proxy's exact fills (one proxy owns the data) instead
	// of a {count, bytes} guard.
	IDOnlyFilters bool
	// MaxUpdateStatements bounds the statements of one rewritten update
	// command (0: only the server's own limits). FerretDB v1.24 keeps each
	// update statement's query open until its command ends, one SQLite
	// connection each out of a pool of 100: an update of 100 statements
	// waits forever for a connection. The proxy also bounds how many such
	// commands run at once (the proxy's writeSlots).
	MaxUpdateStatements int
	// CostlyUpdates: an update rewrites the whole document, at a cost
	// proportional to its size (FerretDB v1.24: read, decode, re-encode and
	// write the JSON of the whole bucket). Small groups then join only
	// buckets still below the rule's insert threshold; see mayJoin.
	CostlyUpdates bool
	// SingleWriter: the upstream's updates are not isolated from each
	// other (FerretDB v1.24 reads a document, changes it in Go and writes
	// it back by _id), so two proxies updating one bucket at once lose an
	// update. The proxy then writes a bucketed namespace only while it
	// holds its writer lease.
	SingleWriter bool
	// PackedEvents: buckets written whole (by a merge, a large insert, a
	// delete's rewrite) keep their events packed in one binary value
	// (bucket.FieldPacked) instead of an array. FerretDB stores a document
	// as JSON, value by value: a bucket of 1,000 events cost it about 7x
	// less to insert and 13x less to read back packed (measured on all
	// three FerretDB upstreams, DESIGN.md). The upstream then cannot see
	// the events, so every read, count, aggregate and delete of events is
	// planned as a scan of whole buckets the proxy filters itself (on
	// FerretDB it had to be for most of them already: its $unwind drops
	// the bucket's meta).
	PackedEvents bool
	// UnusedIndexes: the upstream reads by no index but _id's, whatever
	// indexes a collection has. FerretDB v1.24: its SQLite backend pushes
	// only {_id: X} filters down; its PostgreSQL backend tests a field as
	// _jsonb->'f' @> v (and no ranges), which a btree index on the field
	// cannot serve. The proxy's {meta: 1, start: 1} index would cost
	// storage and writes there for no read, so it is not made;
	// listIndexes shows it all the same, as the app's
	// {metaField: 1, timeField: 1} (rewrite/admin).
	UnusedIndexes bool
}

// Detect reads what the upstream supports from its buildInfo reply.
// FerretDB (which answers with "ferretdbVersion") rejects stmtIds and does
// not implement retryable writes, and pushes only {_id: X} filters down to
// its storage; MongoDB 4.4+ has both and indexes any filter.
func Detect(buildInfo []byte) Upstream {
	doc := bsoncore.Document(buildInfo)
	if _, err := doc.LookupErr("ferretdbVersion"); err == nil {
		return Upstream{IDOnlyFilters: true, CostlyUpdates: true, SingleWriter: true, PackedEvents: true, UnusedIndexes: true,
			MaxUpdateStatements: FerretDBMaxUpdateStatements}
	}
	return Upstream{StmtIDs: true, FullAggregation: true, UnwindKeepsFields: true}
}

// WithoutRetryableWrites is u for an upstream found to keep no retryable
// writes although its buildInfo says MongoDB (FerretDB 2.x refuses
// stmtIds; a standalone MongoDB has no sessions to keep them in): its
// writes go as FerretDB v1.24's do, under the rule's writer lease, events
// staged into each proxy's own staging collections and retries
// recognised by the proxy's own records (rewrite/stage). Without stmtIds
// a retry of an insert that reached the upstream through another proxy
// is not recognised by the upstream, and a proxy that does not hold the
// lease cannot know that no other proxy wrote the buckets it fills.
func (u Upstream) WithoutRetryableWrites() Upstream {
	u.StmtIDs, u.SingleWriter = false, true
	return u
}

// StagesEvents says whether an events rule without an ingest setting is
// staged on this upstream: where updates are costly (FerretDB v1.24),
// and where the upstream keeps no retryable writes of its own, so that
// the staging tier's records keep a retried insert exactly once.
func (u Upstream) StagesEvents() bool { return u.CostlyUpdates || !u.StmtIDs }

// FerretDBMaxUpdateStatements is Caps.MaxUpdateStatements for FerretDB:
// with at most FerretDBWriteSlots such commands at once, their open queries
// stay well under its 100 SQLite connections.
const (
	FerretDBMaxUpdateStatements = 16
	FerretDBWriteSlots          = 4
)
