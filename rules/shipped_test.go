package rules

import (
	"os"
	"strings"
	"testing"
)

// TestShippedConfigExamples: the shipped config.yaml loads, and so do the
// example rules it shows commented out, once uncommented; a key renamed in
// code without the example following would fail here.
func TestShippedConfigExamples(t *testing.T) {
	raw, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	setup(t)
	cfg, err := Load(LoadOptions{Flags: flags(t), ConfigFile: writeFile(t, "shipped.yaml", string(raw))})
	if err != nil {
		t.Fatalf("shipped config.yaml: %v", err)
	}
	shipped := len(cfg.Rules)

	var out []string
	inRules := false
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "rules:") {
			inRules = true
		}
		if inRules && (strings.HasPrefix(l, "#  - ") || strings.HasPrefix(l, "#    ")) {
			l = l[1:]
		}
		out = append(out, l)
	}
	cfg, err = Load(LoadOptions{Flags: flags(t), ConfigFile: writeFile(t, "examples.yaml", strings.Join(out, "\n"))})
	if err != nil {
		t.Fatalf("config.yaml with its example rules uncommented: %v", err)
	}
	if len(cfg.Rules) <= shipped {
		t.Fatalf("%d rules with the examples, %d without: no example found", len(cfg.Rules), shipped)
	}
	for _, r := range cfg.Rules {
		t.Logf("%s: layout %s", r.Namespace, r.Layout)
	}
}
