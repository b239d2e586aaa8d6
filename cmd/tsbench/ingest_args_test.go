package main

import (
	"slices"
	"testing"
)

func TestTakeIngestArgs(t *testing.T) {
	for _, tc := range []struct {
		args, want   []string
		png, cases   string
		runs         int
		backendValue string
	}{
		{args: []string{"tsbench", "-backend", "ferretdb", "-runs", "3", "-png", "/tmp/a.png", "ingest"},
			want: []string{"tsbench", "-backend", "ferretdb", "-runs", "3", "ingest"}, png: "/tmp/a.png", runs: 3, backendValue: "ferretdb"},
		{args: []string{"tsbench", "--png=/tmp/b.png", "-cases=1/1,10/16", "ingest"},
			want: []string{"tsbench", "-cases=1/1,10/16", "ingest"}, png: "/tmp/b.png", cases: "1/1,10/16", runs: 5, backendValue: "embedded"},
		{args: []string{"tsbench", "ingest", "-png", "c.png"},
			want: []string{"tsbench", "ingest"}, png: "c.png", runs: 5, backendValue: "embedded"},
	} {
		saved := ingestArgs
		ingestArgs.png, ingestArgs.cases, ingestArgs.runs, ingestArgs.backend = "", "", 5, "embedded"
		got := takeIngestArgs(tc.args)
		if !slices.Equal(got, tc.want) || ingestArgs.png != tc.png || ingestArgs.cases != tc.cases ||
			ingestArgs.runs != tc.runs || ingestArgs.backend != tc.backendValue {
			t.Errorf("takeIngestArgs(%q) = %q, %+v", tc.args, got, ingestArgs)
		}
		ingestArgs = saved
	}
}
