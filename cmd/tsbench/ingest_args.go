package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/tests/backend"
)

// ingestArgs are what `tsbench ingest` reads of the command line besides
// what main passes it. main.go owns tsbench's flag set; ingest needs one
// flag more (-png) and, because the proxy starts with its rules before
// benchIngest runs, the values of -runs and -cases already when
// ingestRules makes one rule per run and case. init takes -png (and its
// value) out of os.Args before main parses them, and notes the others.
// (Moving -png into main's flag set is a one-line change once main.go is
// free to edit.)
var ingestArgs = struct {
	png     string // path of the chart; "": none
	runs    int    // -runs, main's default when absent
	cases   string // -cases
	backend string // -backend
	custom  bool   // -upstream is set: the backend is a running server
}{runs: 5, backend: backend.KindEmbedded}

func init() { os.Args = takeIngestArgs(os.Args) }

// takeIngestArgs returns args without -png/--png and its value (given as
// -png=x or -png x, before or after the mode), and notes -runs, -cases,
// -backend and -upstream in ingestArgs. Every flag of tsbench takes a
// value, so a flag without "=" is followed by its value.
func takeIngestArgs(args []string) []string {
	if len(args) == 0 {
		return args
	}
	out := []string{args[0]}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			out = append(out, args[i:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			out = append(out, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		next := i
		if !hasVal && i+1 < len(args) {
			next, val = i+1, args[i+1]
		}
		switch name {
		case "png":
			ingestArgs.png = val
			i = next
			continue // taken out
		case "runs":
			if n, err := strconv.Atoi(val); err == nil {
				ingestArgs.runs = n
			}
		case "cases":
			ingestArgs.cases = val
		case "backend":
			ingestArgs.backend = val
		case "upstream":
			ingestArgs.custom = val != ""
		}
		out = append(out, args[i:next+1]...)
		i = next
	}
	return out
}
