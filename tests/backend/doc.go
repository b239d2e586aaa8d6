// Package backend starts the FerretDB upstreams that tsproxy is tested and
// measured on, for tests/e2e and cmd/tsbench alike:
//
//   - embedded: FerretDB v1.24 with SQLite, in this process, with the
//     SQLite _id index the proxy adds (Upstream.Embedded.IndexIDs);
//   - ferretdb: the stock ferretdb command with --handler=sqlite (no such
//     index);
//   - postgresql: the ferretdb command with --handler=postgresql over a
//     throwaway PostgreSQL cluster.
//
// Child processes die with the process that started them (Linux), and
// every folder is a temporary one removed on Close. It holds no proxy
// logic and must not import proxy/ or rewrite/.
package backend
