// Command tsproxy is a MongoDB wire-protocol proxy that stores the events of
// the namespaces named by its rules as time-series buckets, and passes all
// other traffic through unchanged.
//
//	tsproxy --config FILE [--listen HOST:PORT] [--listen-unix PATH] [--upstream URI|embedded] [--data DIR]
//	tsproxy migrate --config FILE --rule NAMESPACE --from DB.COLLECTION [--batch N]
//	tsproxy rollups rebuild --config FILE --rule NAMESPACE
//	tsproxy unpack --config FILE --rule NAMESPACE [--dry-run]
//	tsproxy summaries --config FILE --rule NAMESPACE [--dry-run]
//
// It loads config.yaml (with flags and TSPROXY_* environment variables over
// it), starts the embedded FerretDB when no upstream URI is configured, and
// serves MongoDB clients until SIGINT or SIGTERM, then drains in-flight
// requests. It wires packages together and owns no protocol or bucket
// logic.
package main
