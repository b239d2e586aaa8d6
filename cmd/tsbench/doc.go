// Command tsbench measures tsproxy against the direct path to the same
// upstream, in one run, and prints medians over several runs and the
// ratios. The machines it runs on are shared and noisy: read the medians.
//
//	tsbench passthrough   ping and a small find: p50/p99 latency and throughput
//	tsbench ingest        bucketed inserts vs plain inserts: events/s, documents, sizes
//	tsbench calls         one per-event insert, direct and through the proxy, four kinds interleaved: where its time goes
//	tsbench layouts       counter and slots layouts vs plain inserts: events/s, documents, sizes
//	tsbench mergefill     a merge of a few slots events into windows filled to different degrees
//	tsbench shapes        one slots bucket's insert, find and replace by _id, direct, in each stored form
//	tsbench range         range finds on buckets vs on plain documents: latency, documents examined
//	tsbench summary       hourly aggregates from bucket summaries vs a scan of plain documents
//	tsbench dashboard     per-event inserts into a rule with history, read after every few: read latency, and the merge's share of it
//
// -backend picks the FerretDB it starts (embedded, the stock ferretdb
// command on SQLite, or ferretdb on a throwaway PostgreSQL cluster);
// -upstream measures on a running server instead.
//
// It owns no proxy logic: it starts the proxy (package proxy) and the
// upstream (package upstream, tests/backend) as the product does.
package main
