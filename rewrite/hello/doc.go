// Package hello shapes the handshake: the client's hello (or legacy
// isMaster) as sent upstream, the upstream's reply as returned to the
// client (compression negotiated by the proxy, not the upstream), and the
// reply the proxy gives itself as a router (mongos) in load-balanced mode.
//
// It does no I/O and keeps no state.
package hello
