package rules

import (
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// kind is the shape a key's value must have in the file.
type kind int

const (
	scalar  kind = iota // a string, number or boolean
	mapping             // a mapping with the keys of children
	list                // a sequence of scalars
	mapList             // a sequence of mappings with the keys of children
)

type keySpec struct {
	name     string // as documented (camelCase); matched ignoring case, as viper does
	kind     kind
	children []keySpec
}

func leaves(names ...string) []keySpec {
	s := make([]keySpec, len(names))
	for i, n := range names {
		s[i] = keySpec{name: n}
	}
	return s
}

// schema lists every key of the config file.
var schema = []keySpec{
	{name: "listen"},
	{name: "listenUnix"},
	{name: "listenTLS", kind: mapping, children: leaves("certFile", "keyFile", "caFile", "clientAuth")},
	{name: "upstream", kind: mapping, children: []keySpec{
		{name: "uri"},
		{name: "dataDir"},
		{name: "dialTimeout"},
		{name: "tls", kind: mapping, children: leaves("enabled", "caFile", "certFile", "keyFile", "insecureSkipVerify", "serverName")},
	}},
	{name: "limits", kind: mapping, children: leaves("maxConnections", "maxMessageBytes", "maxCursors", "cursorTTL", "frameTimeout", "writeTimeout", "retryCacheSize", "retryCacheTTL", "aggregateMemory", "stagedMemory")},
	{name: "telemetry", kind: mapping, children: leaves("metricsListen", "otlpEndpoint", "serviceName", "logLevel", "logFormat")},
	{name: "rules", kind: mapList, children: []keySpec{
		{name: "namespace"},
		{name: "timeField"},
		{name: "metaField"},
		{name: "layout"},
		{name: "window"},
		{name: "slot"},
		{name: "valueField"},
		{name: "preallocate"},
		{name: "packed"},
		{name: "bucket", kind: mapping, children: leaves("span", "granularity", "maxEvents", "maxBytes", "insertThreshold", "compression")},
		{name: "aggregates", kind: list},
		{name: "collection"},
		{name: "rollups", kind: list},
		{name: "expireAfter"},
		{name: "sweepInterval"},
		{name: "shardKey"},
		{name: "partitionBy"},
		{name: "ingest"},
		{name: "mergeAfter"},
		{name: "maxStaged"},
	}},
	{name: "shutdownTimeout"},
	{name: "createTimeseries"},
}

// checkKeys walks the parsed file and reports every key the schema does
// not know, every key given twice (keys ignore case) and every value of the
// wrong shape, in file order, naming keys as the file spells them.
func checkKeys(root *yaml.Node) []error {
	w := &keyWalker{}
	doc := root
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil
		}
		doc = doc.Content[0]
	}
	w.value(doc, "", keySpec{kind: mapping, children: schema})
	return w.errs
}

type keyWalker struct{ errs []error }

func (w *keyWalker) fail(key, format string, args ...any) {
	w.errs = append(w.errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return fmt.Sprintf("%q", n.Value)
	}
}

// value checks node n, found at path, against spec.
func (w *keyWalker) value(n *yaml.Node, path string, spec keySpec) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	name := path
	if name == "" {
		name = "the file"
	}
	switch spec.kind {
	case scalar:
		if n.Kind != yaml.ScalarNode {
			w.fail(path, "%s: must be a single value, not %s", path, describe(n))
		}
	case list:
		if n.Kind != yaml.SequenceNode {
			w.fail(path, "%s: must be a list such as [a, b], not %s", path, describe(n))
			return
		}
		for i, item := range n.Content {
			if item = resolve(item); !isNull(item) && item.Kind != yaml.ScalarNode {
				p := fmt.Sprintf("%s[%d]", path, i)
				w.fail(p, "%s: must be a single value, not %s", p, describe(item))
			}
		}
	case mapList:
		if n.Kind != yaml.SequenceNode {
			w.fail(path, "%s: must be a list, not %s", path, describe(n))
			return
		}
		for i, item := range n.Content {
			w.value(item, fmt.Sprintf("%s[%d]", path, i), keySpec{kind: mapping, children: spec.children})
		}
	case mapping:
		if n.Kind != yaml.MappingNode {
			w.fail(path, "%s: must be a mapping of keys (%s), not %s", name, names(spec.children), describe(n))
			return
		}
		w.mapping(n, path, spec.children, map[string]string{})
	}
}

// mapping checks the keys of mapping n; seen maps a lower-cased key to the
// path where it was first seen (shared with merged "<<" mappings).
func (w *keyWalker) mapping(n *yaml.Node, path string, children []keySpec, seen map[string]string) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			// <<: *anchor or <<: [*a, *b]
			val = resolve(val)
			if val.Kind == yaml.SequenceNode {
				for _, m := range val.Content {
					if m = resolve(m); m.Kind == yaml.MappingNode {
						w.mapping(m, path, children, seen)
					}
				}
			} else if val.Kind == yaml.MappingNode {
				w.mapping(val, path, children, seen)
			}
			continue
		}
		key := join(path, k.Value)
		lower := strings.ToLower(k.Value)
		if first, ok := seen[lower]; ok {
			w.fail(key, "%s repeats %s (keys ignore case)", key, first)
			continue
		}
		seen[lower] = key
		spec, ok := findKey(children, k.Value)
		if !ok {
			msg := fmt.Sprintf("unknown key %q", key)
			if s := suggest(children, k.Value); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", join(path, s))
			}
			w.fail(key, "%s", msg)
			continue
		}
		w.value(val, key, spec)
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func findKey(children []keySpec, name string) (keySpec, bool) {
	for _, c := range children {
		if strings.EqualFold(c.name, name) {
			return c, true
		}
	}
	return keySpec{}, false
}

func names(children []keySpec) string {
	s := make([]string, len(children))
	for i, c := range children {
		s[i] = c.name
	}
	return strings.Join(s, ", ")
}

// suggest returns the known key closest to name when it is close enough
// to be a typo.
func suggest(children []keySpec, name string) string {
	type cand struct {
		name string
		dist int
	}
	var cs []cand
	for _, c := range children {
		d := editDistance(strings.ToLower(c.name), strings.ToLower(name))
		limit := 2
		if len(c.name) <= 4 {
			limit = 1
		}
		if d <= limit {
			cs = append(cs, cand{c.name, d})
		}
	}
	if len(cs) == 0 {
		return ""
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].dist < cs[j].dist })
	return cs[0].name
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
