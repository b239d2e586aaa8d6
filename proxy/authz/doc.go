// Package authz authorizes a command on a bucketed namespace by the
// upstream before the proxy answers anything of its own (a refusal, an
// invalid event, a recorded reply, a batch of a cursor it holds): the
// client must see the
// server's authorization error wherever the server would give one, and
// learn nothing of the rule or of others' data first.
//
// The check runs on the client's own upstream connection, with its
// credentials: a find by an impossible _id on the app's namespace (always
// empty: the events are in the bucket collection), which any backend
// answers at once. A refusal is answered to the client as the upstream gave
// it. Where the upstream reports privileges (MongoDB's connectionStatus),
// the action the command needs (insert, remove, update) is checked too;
// FerretDB authorizes any authenticated user for everything.
//
// Verdicts are kept per connection until its authentication changes (any
// saslStart, saslContinue, authenticate or logout, or a hello carrying
// speculativeAuthenticate, passes through) or authVerdictTTL passes, so a
// connection pays one probe per namespace, not one per command.
package authz
