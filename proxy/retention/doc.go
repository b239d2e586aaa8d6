// Package retention keeps rules' retention (a rule's expireAfter). Each
// collection that ages out (the bucket collection and the rollup
// collections, see rollup.Expiries) is first given a TTL index on start with expireAfterSeconds = expireAfter +
// the document's window, so MongoDB removes expired documents itself. An
// upstream that refuses TTL indexes (FerretDB v1.24 answers NotImplemented)
// is swept by the proxy instead: every sweepInterval, a delete of
// {start: {$lt: now - expireAfter - window}}. Either way no end field is
// stored: start plus the window is the end.
//
// Retention runs on connections of its own, dialled like the clients'
// (so with the credentials of the upstream URI, if any), one goroutine per
// rule with expireAfter; in a fleet, only the proxy holding the rule's
// retention lease sweeps (ownsRetention).
package retention
