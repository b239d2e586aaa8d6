// Package handler serves the commands of client connections: the front
// door (package proxy) hands each frame to its connection's Conn, which
// decodes it, routes it (through unchanged, or rewritten for a bucketed
// namespace), runs its plan on the client's upstream connection through
// proxy/exec and answers through the connection's Front.
//
// route looks a command up in frontCommands (hello, create,
// listCollections and the others served here whatever the namespace),
// else routes it by the rule it names (routeByRule). A command on a
// bucketed namespace passes the gates (catalog, authorization, cursor
// owner, retry cache, staging settled), each of which returns one error
// (errAnswered when it answered the request itself), then its handler
// from the commands registry. The rules a request is routed by are the
// config file's and those of the time-series collections apps created
// (proxy/catalog); each Conn takes a fresh enough rule set per request,
// and the background loops (merges in proxy/tier, retention in
// proxy/retention) follow the set as it changes.
//
// What the connections share (the upstream's abilities, cursors, the
// reply cache, the open-bucket fills, the writer leases, the staging tier
// and the catalog) is the engine (proxy/engine), safe for concurrent use;
// the proxy's own commands are proxy/admin's, authorization proxy/authz's.
// A Conn's own state (its upstream connection, its authorization
// verdicts, the reply being built) needs no locks.
package handler
