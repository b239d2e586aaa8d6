package rules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRedactReservedInPassword: Redact must hide a password that
// holds '/' or '?' (unescaped; the driver accepts '?', and reports '/' in
// an error that the config error then prints through Redact).
func TestRedactReservedInPassword(t *testing.T) {
	for _, uri := range []string{
		"mongodb://u:pa?ss@h:1/?tls=true",
		"mongodb://u:pa/ss@h/",
	} {
		if got := Redact(uri); strings.Contains(got, "pa?ss") || strings.Contains(got, "pa/ss") {
			t.Errorf("Redact(%q) = %q: password shown", uri, got)
		}
	}
	setup(t)
	_, err := Load(LoadOptions{ConfigFile: writeFile(t, "c.yaml", "upstream:\n  uri: mongodb://u:pa/ss@h/\n")})
	if err == nil {
		t.Fatal("accepted")
	}
	if strings.Contains(err.Error(), "pa/ss") {
		t.Errorf("config error shows the password: %v", err)
	}
}

// TestRuleCollisions: collections a rule's rollups, partitions or the
// proxy's own bookkeeping (writer leases, staging) use must not be another
// rule's namespace or bucket collection.
func TestRuleCollisions(t *testing.T) {
	for _, y := range []string{
		// rollup collection of rules[0] is rules[1]'s namespace
		"rules:\n  - {namespace: iot.a, timeField: t, rollups: [1h]}\n  - {namespace: iot.a.rollup_1h, timeField: t}\n",
		// rules[0]'s bucket collection is rules[1]'s rollup collection
		"rules:\n  - {namespace: iot.a, timeField: t, collection: b.rollup_1h}\n  - {namespace: iot.b, timeField: t, rollups: [1h]}\n",
		// a partition of rules[0] is rules[1]'s namespace
		"rules:\n  - {namespace: iot.a, timeField: t, partitionBy: month}\n  - {namespace: iot.a.buckets_2026_01, timeField: t}\n",
		// buckets in the proxy's writer-lease collection
		"rules:\n  - {namespace: iot.a, timeField: t, collection: tsproxy_leases}\n",
		// rules[0]'s buckets in rules[1]'s event-id index collection
		// (a staging name: tsproxy_stage_<hash of b.buckets>_ids)
		"rules:\n  - {namespace: iot.a, timeField: t, collection: " + stagePrefixOf("b.buckets") + "ids}\n  - {namespace: iot.b, timeField: t}\n",
	} {
		c, err := loadYAML(t, y)
		if err == nil {
			t.Errorf("accepted:\n%s  rules: %d", y, len(c.Rules))
			continue
		}
		t.Logf("%v", err)
	}
}

// TestByteUnitsInLimits: config.yaml says "Byte counts are a number or
// a number with a unit: KiB, MiB (x1024) or KB, MB (x1000)"; the byte
// limits refused units.
func TestByteUnitsInLimits(t *testing.T) {
	c, err := loadYAML(t, "limits:\n  aggregateMemory: 100MiB\n  stagedMemory: 64MiB\n  maxMessageBytes: 16MiB\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.AggregateMemory != 100<<20 || c.Limits.StagedMemory != 64<<20 || c.Limits.MaxMessageBytes != 16<<20 {
		t.Errorf("limits %+v", c.Limits)
	}
}

// TestEnvTypoTopLevel: $TSPROXY_LISTEN_UNIX (spelt like the flag
// --listen-unix) names no key; it was silently ignored and no socket
// opened. It is refused, naming the variable meant.
func TestEnvTypoTopLevel(t *testing.T) {
	setup(t)
	t.Setenv("TSPROXY_LISTEN_UNIX", "/tmp/tsproxy.sock")
	c, err := Load(LoadOptions{})
	if err == nil {
		t.Fatalf("accepted; listenUnix %q", c.ListenUnix)
	}
	if !strings.Contains(err.Error(), "did you mean $TSPROXY_LISTENUNIX?") {
		t.Fatalf("err %v, want the variable meant", err)
	}
}

// TestEmptyConfigFlag: --config "" (say --config "$CFG" with CFG
// unset) names no file; Load read none, not even config.yaml in the
// working directory, and started on the defaults. It is refused.
func TestEmptyConfigFlag(t *testing.T) {
	dir := setup(t)
	if err := os.WriteFile(filepath.Join(dir, DefaultConfigFile), []byte("listen: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(LoadOptions{Flags: flags(t, "--config=")})
	if err == nil {
		t.Errorf("accepted: file %q, listen %q", c.File, c.Listen)
	}
}

// TestMaxBytesAbsurd: bucket.maxBytes had no lower bound; with 1
// every event is over it and every insert is refused.
func TestMaxBytesAbsurd(t *testing.T) {
	c, err := loadYAML(t, "rules:\n  - namespace: a.b\n    timeField: t\n    bucket: {maxBytes: 1}\n")
	if err == nil {
		t.Errorf("accepted maxBytes %d", c.Rules[0].MaxBytes)
	}
}
