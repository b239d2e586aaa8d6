// Package cursors is the proxy's registry of the cursors rewritten reads
// opened: bounded in size and idle time, each with the users and session
// it belongs to. It is a data structure: no I/O, and no decision of who
// may use a cursor beyond what ForgetSessions documents.
package cursors
