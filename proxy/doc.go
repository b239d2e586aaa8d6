// Package proxy is the front door: it accepts client connections, reads
// their frames, routes each message (through unchanged, or rewritten for
// a bucketed namespace) and answers, and it keeps the state that spans
// messages: one upstream connection per client, the cursor registry, what
// the upstream supports. It holds no bucket math: rewrite/ plans every
// rewritten command, and proxy/exec runs the plans (exec.Drive) and the
// proxy's own single commands.
//
// A connection's messages are handled one at a time by its conn, so
// per-connection state (the upstream connection, the authorization
// verdicts, the reply being built) needs no locks; state shared between
// connections (cursors, the reply cache, the open-bucket fills, the writer
// leases, the staging tier, proxy/tier) lives in the Server and
// is safe for concurrent use. Nothing is process-wide: two Servers in one
// process share nothing, and the metrics a Server registers end at its
// Shutdown.
//
// route looks a command up in frontCommands (hello, create, listCollections
// and the others the front door serves itself), else routes it by the rule
// it names (routeByRule). A command on a bucketed namespace passes the
// gates (catalog, authorization, cursor owner, retry cache, staging
// settled), each of which returns one error (errAnswered when it answered
// the request itself), then its handler. The rules a request is routed by
// are the config file's and those of the time-series collections apps
// created (proxy/catalog); each conn takes a fresh enough rule set per
// request, and the background loops (merges in proxy/tier,
// retention in proxy/retention) follow the set as it changes.
package proxy
