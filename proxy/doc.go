// Package proxy accepts client connections, routes each message (through
// unchanged, or rewritten for a bucketed namespace), and keeps the state
// that spans messages: one upstream connection per client, the cursor
// registry, what the upstream supports. It knows nothing of bucket math.
//
// A connection's messages are handled one at a time by its conn,
// so per-connection state (the upstream connection, the authorization
// verdicts, the reply being built) needs no locks; state shared between
// connections (cursors, the reply cache, the open-bucket fills, the writer
// lease) lives in the Server and is safe for concurrent use. Nothing is
// process-wide: two Servers in one process share nothing.
//
// The rules a request is routed by are the config file's and those of the
// time-series collections apps created, kept in the upstream's catalog; each
// conn takes a fresh enough rule set per
// request, and the background loops follow the set as it changes.
//
// Every rewritten command is a rewrite.Plan run by drive: the
// span, the write slot, the lease and the reply cache wrap that one loop.
// It must not build upstream commands for bucket collections itself (that
// is rewrite's), nor parse bucket documents.
package proxy
