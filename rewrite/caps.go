package rewrite

// Caps is what one upstream supports, detected once per upstream by the
// proxy (buildInfo: FerretDB answers with "ferretdbVersion").
type Caps struct {
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
}
