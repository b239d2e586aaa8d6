// Package benchenv is the environment of a tsbench run: the upstream
// (embedded, the stock ferretdb command, FerretDB on PostgreSQL, or a
// URI), a proxy in front of it, clients of both paths for the
// interleaved comparisons, and the helpers every mode shares (medians,
// percentiles, profiles).
package benchenv
