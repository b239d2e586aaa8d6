// Package e2e drives tsproxy end to end: a real upstream (the embedded
// FerretDB with SQLite, started in-process on a free port, or the MongoDB
// named by TSPROXY_E2E_UPSTREAM), the proxy in-process on another free
// port, and real clients: the official Go driver and mongosh.
package e2e
