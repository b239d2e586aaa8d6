package main

import "github.com/tsproxy/tsproxy/tests/backend"

// ingestArgs are the command-line values `tsbench ingest` reads besides
// what main passes benchIngest: ingestRules needs -runs and -cases before
// the proxy starts (one rule per run and case), and the report names the
// backend and writes the chart. main fills them after parsing its flags.
var ingestArgs = struct {
	png     string // -png: path of the chart; "": none
	runs    int    // -runs
	cases   string // -cases
	backend string // -backend
	custom  bool   // -upstream is set: the backend is a running server
	prefill int    // -prefill: events each case's rule and plain collection hold before it is timed
	records int    // -records: derived ids each case's rule has recorded as merged before it is timed
	mode    string // -ingest: the rule's ingest setting (staged, direct)
}{runs: 5, backend: backend.KindEmbedded, mode: "staged"}
