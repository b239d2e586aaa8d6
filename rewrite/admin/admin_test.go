package admin

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

func TestPlanCreate(t *testing.T) {
	cases := []struct {
		name string
		body D
		want D
		err  string
	}{
		{"plain", D{{Key: "create", Value: "readings"}, {Key: "$db", Value: "iot"}},
			D{{Key: "create", Value: "readings.buckets"}, {Key: "$db", Value: "iot"}}, ""},
		{"generic arguments", D{{Key: "create", Value: "readings"}, {Key: "writeConcern", Value: D{{Key: "w", Value: 1}}}, {Key: "lsid", Value: D{{Key: "id", Value: 1}}}, {Key: "$db", Value: "iot"}},
			D{{Key: "create", Value: "readings.buckets"}, {Key: "lsid", Value: D{{Key: "id", Value: 1}}}, {Key: "writeConcern", Value: D{{Key: "w", Value: 1}}}, {Key: "$db", Value: "iot"}}, ""},
		{"matching timeseries", D{{Key: "create", Value: "readings"}, {Key: "timeseries", Value: D{{Key: "timeField", Value: "ts"}, {Key: "metaField", Value: "sensorId"}, {Key: "granularity", Value: "hours"}}}},
			D{{Key: "create", Value: "readings.buckets"}, {Key: "$db", Value: "iot"}}, ""},
		{"other timeField", D{{Key: "create", Value: "readings"}, {Key: "timeseries", Value: D{{Key: "timeField", Value: "t"}}}}, nil, `timeseries.timeField "t" differs from the rule's timeField "ts"`},
		{"other metaField", D{{Key: "create", Value: "readings"}, {Key: "timeseries", Value: D{{Key: "timeField", Value: "ts"}, {Key: "metaField", Value: "m"}}}}, nil, `metaField "m" differs`},
		{"capped", D{{Key: "create", Value: "readings"}, {Key: "capped", Value: true}}, nil, `create option "capped" is not supported`},
		{"validator", D{{Key: "create", Value: "readings"}, {Key: "validator", Value: D{}}}, nil, `create option "validator"`},
		{"other collection", D{{Key: "create", Value: "x"}}, nil, "does not match"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := PlanCreate(rwtest.Doc(t, c.body), rwtest.Rule())
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rwtest.AssertDoc(t, "create", got, c.want)
		})
	}
}

func TestPlanCreateIndexes(t *testing.T) {
	idx := func(key D, extra ...E) D {
		return append(D{{Key: "key", Value: key}, {Key: "name", Value: "n"}}, extra...)
	}
	cases := []struct {
		name    string
		indexes A
		want    A
		err     string
	}{
		{"meta and time", A{idx(D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: -1}})}, A{idx(D{{Key: "meta", Value: 1}, {Key: "start", Value: -1}})}, ""},
		{"inside meta", A{idx(D{{Key: "sensorId.site", Value: 1}}, E{Key: "background", Value: true})}, A{idx(D{{Key: "meta.site", Value: 1}}, E{Key: "background", Value: true})}, ""},
		{"event field", A{idx(D{{Key: "value", Value: 1}})}, nil, `an index on "value" is not supported on a bucketed namespace: only the metaField "sensorId"`},
		{"_id", A{idx(D{{Key: "_id", Value: 1}})}, nil, `an index on "_id"`},
		{"text", A{idx(D{{Key: "sensorId", Value: "text"}})}, nil, "only 1 and -1"},
		{"unique", A{idx(D{{Key: "sensorId", Value: 1}}, E{Key: "unique", Value: true})}, nil, `index option "unique"`},
		{"ttl", A{idx(D{{Key: "ts", Value: 1}}, E{Key: "expireAfterSeconds", Value: 60})}, nil, `index option "expireAfterSeconds"`},
		{"no name", A{D{{Key: "key", Value: D{{Key: "ts", Value: 1}}}}}, nil, `needs "key" and "name"`},
		{"none", A{}, nil, "at least one index"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := rwtest.Doc(t, D{{Key: "createIndexes", Value: "readings"}, {Key: "indexes", Value: c.indexes}, {Key: "$db", Value: "iot"}})
			got, err := PlanCreateIndexes(body, rwtest.Rule(), false)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rwtest.AssertDoc(t, "createIndexes", got, D{{Key: "createIndexes", Value: "readings.buckets"}, {Key: "indexes", Value: c.want}, {Key: "$db", Value: "iot"}})
		})
	}
}

// TestCreateIndexEmptyMetaField: metaField "" is stored in each event,
// so an index on it is refused, saying so.
func TestCreateIndexEmptyMetaField(t *testing.T) {
	rule := rules.NewCreatedRule(rules.Created{DB: "iot", Collection: "e", TimeField: "t",
		Declared: rules.Timeseries{Granularity: "seconds", EmptyMetaField: true}, SpanSeconds: 3600})
	body := rwtest.Doc(t, D{{Key: "createIndexes", Value: "e"}, {Key: "indexes", Value: A{D{{Key: "key", Value: D{{Key: "", Value: 1}}}, {Key: "name", Value: "n"}}}}, {Key: "$db", Value: "iot"}})
	_, err := PlanCreateIndexes(body, &rule, false)
	if err == nil || !strings.Contains(err.Error(), `the metaField "" is not supported: tsproxy stores the "" field in each event`) {
		t.Fatalf("err %v", err)
	}
}

// TestListIndexesReply: the bucket indexes as a native time-series
// collection lists its own: no _id index, the {meta, start} index as
// MongoDB's {metaField: 1, timeField: 1}.
func TestListIndexesReply(t *testing.T) {
	spec := func(name string, key D) D {
		return D{{Key: "v", Value: 2}, {Key: "key", Value: key}, {Key: "name", Value: name}, {Key: "ns", Value: "iot.readings.buckets"}}
	}
	reply := rwtest.CursorReply(t, 0,
		spec("_id_", D{{Key: "_id", Value: 1}}),
		spec("meta_1_start_1", D{{Key: "meta", Value: 1}, {Key: "start", Value: 1}}),
		spec("site", D{{Key: "meta.site", Value: -1}}),
		spec("direct", D{{Key: "events.value", Value: 1}}),
	)
	app := func(name string, key D) D {
		return D{{Key: "v", Value: 2}, {Key: "key", Value: key}, {Key: "name", Value: name}, {Key: "ns", Value: "iot.readings"}}
	}
	rwtest.AssertDoc(t, "listIndexes", ListIndexesReply(reply, rwtest.Rule(), false), D{{Key: "cursor", Value: D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}, {Key: "firstBatch", Value: A{
		app("sensorId_1_ts_1", D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1}}),
		app("site", D{{Key: "sensorId.site", Value: -1}}),
	}}}}, {Key: "ok", Value: 1.0}})
	// An upstream error names the app's namespace.
	got := ListIndexesReply(rwtest.Doc(t, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "ns does not exist: iot.readings.buckets"}, {Key: "code", Value: 26}}), rwtest.Rule(), true)
	rwtest.AssertDoc(t, "error", got, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "ns does not exist: iot.readings"}, {Key: "code", Value: 26}, {Key: "codeName", Value: "NamespaceNotFound"}})
}

// TestOwnIndexVirtual: where the upstream reads by no index of the
// proxy's (FerretDB), its own index is not made but listed, first, as a
// native collection lists its {metaField: 1, timeField: 1}; listed once
// where a bucket collection has it from before; and a create of it alone
// is answered as one of an index that exists.
func TestOwnIndexVirtual(t *testing.T) {
	upSpec := func(name string, key D) D {
		return D{{Key: "v", Value: 2}, {Key: "key", Value: key}, {Key: "name", Value: name}}
	}
	own := D{{Key: "v", Value: 2}, {Key: "key", Value: D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1}}}, {Key: "name", Value: "sensorId_1_ts_1"}}
	site := D{{Key: "v", Value: 2}, {Key: "key", Value: D{{Key: "sensorId.site", Value: -1}}}, {Key: "name", Value: "site"}}
	listed := func(specs ...D) D {
		a := A{}
		for _, s := range specs {
			a = append(a, s)
		}
		return D{{Key: "cursor", Value: D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}, {Key: "firstBatch", Value: a}}}, {Key: "ok", Value: 1.0}}
	}
	without := rwtest.CursorReply(t, 0, upSpec("_id_", D{{Key: "_id", Value: 1}}), upSpec("site", D{{Key: "meta.site", Value: -1}}))
	with := rwtest.CursorReply(t, 0, upSpec("_id_", D{{Key: "_id", Value: 1}}), upSpec("meta_1_start_1", D{{Key: "meta", Value: 1}, {Key: "start", Value: 1}}), upSpec("site", D{{Key: "meta.site", Value: -1}}))
	t.Run("listed when virtual", func(t *testing.T) {
		rwtest.AssertDoc(t, "listIndexes", ListIndexesReply(without, rwtest.Rule(), true), listed(own, site))
	})
	t.Run("not listed when it is not there and not virtual", func(t *testing.T) {
		rwtest.AssertDoc(t, "listIndexes", ListIndexesReply(without, rwtest.Rule(), false), listed(site))
	})
	t.Run("made before: listed once", func(t *testing.T) {
		rwtest.AssertDoc(t, "listIndexes", ListIndexesReply(with, rwtest.Rule(), true), listed(own, site))
	})
	t.Run("no metaField: none", func(t *testing.T) {
		rule := rwtest.Rule()
		rule.MetaField = ""
		rwtest.AssertDoc(t, "listIndexes", ListIndexesReply(rwtest.CursorReply(t, 0, upSpec("_id_", D{{Key: "_id", Value: 1}})), rule, true), listed())
	})
	create := func(indexes A) []byte {
		return rwtest.Doc(t, D{{Key: "createIndexes", Value: "readings"}, {Key: "indexes", Value: indexes}, {Key: "writeConcern", Value: D{{Key: "w", Value: 1}}}, {Key: "$db", Value: "iot"}})
	}
	ownSpec := D{{Key: "key", Value: D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1.0}}}, {Key: "name", Value: "mine"}}
	siteSpec := D{{Key: "key", Value: D{{Key: "sensorId.site", Value: -1}}}, {Key: "name", Value: "site"}}
	t.Run("create with others: the own one left out", func(t *testing.T) {
		got, err := PlanCreateIndexes(create(A{ownSpec, siteSpec}), rwtest.Rule(), true)
		if err != nil {
			t.Fatal(err)
		}
		rwtest.AssertDoc(t, "createIndexes", got, D{{Key: "createIndexes", Value: "readings.buckets"}, {Key: "indexes", Value: A{
			D{{Key: "key", Value: D{{Key: "meta.site", Value: -1}}}, {Key: "name", Value: "site"}}}}, {Key: "writeConcern", Value: D{{Key: "w", Value: 1}}}, {Key: "$db", Value: "iot"}})
	})
	t.Run("create with others: made when not virtual", func(t *testing.T) {
		got, err := PlanCreateIndexes(create(A{ownSpec}), rwtest.Rule(), false)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := bsoncore.Document(got).Lookup("indexes").Array().Values(); len(n) != 1 {
			t.Fatalf("indexes: %s", rwtest.JSON(got))
		}
	})
	t.Run("create of it alone", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			created D
			want    D
		}{
			{"collection made", D{{Key: "ok", Value: 1.0}}, D{{Key: "numIndexesBefore", Value: 2}, {Key: "numIndexesAfter", Value: 2}, {Key: "createdCollectionAutomatically", Value: true}, {Key: "note", Value: "all indexes already exist"}, {Key: "ok", Value: 1.0}}},
			{"collection there", D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "exists"}, {Key: "code", Value: 48}}, D{{Key: "numIndexesBefore", Value: 2}, {Key: "numIndexesAfter", Value: 2}, {Key: "note", Value: "all indexes already exist"}, {Key: "ok", Value: 1.0}}},
		} {
			t.Run(c.name, func(t *testing.T) {
				p := CreateIndexes(create(A{ownSpec}), rwtest.Rule(), true)
				step, done := p.Next()
				if done || len(step) != 1 {
					t.Fatalf("first step: %v %v", step, done)
				}
				rwtest.AssertDoc(t, "create", step[0].Body, D{{Key: "create", Value: "readings.buckets"}, {Key: "$db", Value: "iot"}})
				if err := p.Feed([][]byte{rwtest.Doc(t, c.created)}); err != nil {
					t.Fatal(err)
				}
				step, done = p.Next()
				if done || len(step) != 1 {
					t.Fatalf("second step: %v %v", step, done)
				}
				rwtest.AssertDoc(t, "listIndexes", step[0].Body, D{{Key: "listIndexes", Value: "readings.buckets"}, {Key: "$db", Value: "iot"}})
				if err := p.Feed([][]byte{without}); err != nil {
					t.Fatal(err)
				}
				if _, done = p.Next(); !done {
					t.Fatal("a third step")
				}
				rwtest.AssertDoc(t, "reply", p.Result().Reply, c.want)
			})
		}
	})
	t.Run("create of it alone, the upstream refuses", func(t *testing.T) {
		p := CreateIndexes(create(A{ownSpec}), rwtest.Rule(), true)
		p.Next()
		_ = p.Feed([][]byte{rwtest.Doc(t, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "not authorized to create iot.readings.buckets"}, {Key: "code", Value: 13}})})
		if _, done := p.Next(); !done {
			t.Fatal("went on after a refused create")
		}
		if !strings.HasSuffix(mongoerr.FromReply(p.Result().Reply, "").Error(), "create iot.readings") {
			t.Fatalf("reply %s: want the app's namespace", rwtest.JSON(p.Result().Reply))
		}
	})
}

func TestPlanDropIndexes(t *testing.T) {
	cases := []struct {
		name     string
		index    any
		want     any
		recreate bool
		err      string
	}{
		{"by name", "site", "site", false, ""},
		{"all", "*", "*", true, ""},
		{"names", A{"a", "b"}, A{"a", "b"}, false, ""},
		{"key pattern", D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: -1}}, D{{Key: "meta", Value: 1}, {Key: "start", Value: -1}}, false, ""},
		{"the proxy's by name", "meta_1_start_1", nil, false, "the proxy's own"},
		{"the proxy's in names", A{"a", "meta_1_start_1"}, nil, false, "the proxy's own"},
		{"the proxy's by key", D{{Key: "sensorId", Value: 1}, {Key: "ts", Value: 1}}, nil, false, "the proxy's own"},
		{"the proxy's by key, doubles", D{{Key: "sensorId", Value: 1.0}, {Key: "ts", Value: int64(1)}}, nil, false, "the proxy's own"},
		{"event field key", D{{Key: "value", Value: 1}}, nil, false, `an index on "value"`},
		{"number", 5, nil, false, "must be a name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := rwtest.Doc(t, D{{Key: "dropIndexes", Value: "readings"}, {Key: "index", Value: c.index}, {Key: "$db", Value: "iot"}})
			got, recreate, err := PlanDropIndexes(body, rwtest.Rule())
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || recreate != c.recreate {
				t.Fatalf("err %v recreate %v", err, recreate)
			}
			rwtest.AssertDoc(t, "dropIndexes", got, D{{Key: "dropIndexes", Value: "readings.buckets"}, {Key: "index", Value: c.want}, {Key: "$db", Value: "iot"}})
		})
	}
}

// TestMeasurementIndexes: an index on one of the rule's aggregates is,
// as MongoDB makes a time-series collection's, an index on the buckets'
// min and max of the field (max first when descending), alone or after
// the metaField; listIndexes shows it as the app made it, and a pair
// that is not one field's min and max is left out.
func TestMeasurementIndexes(t *testing.T) {
	rule := rwtest.Rule()
	rule.Aggregates = []string{"value", "env.temp"}
	idx := func(name string, key D) D { return D{{Key: "key", Value: key}, {Key: "name", Value: name}} }
	cases := []struct {
		name string
		app  D
		up   D
		err  string
	}{
		{"ascending", D{{Key: "value", Value: 1}}, D{{Key: "min.value", Value: 1}, {Key: "max.value", Value: 1}}, ""},
		{"descending", D{{Key: "value", Value: -1}}, D{{Key: "max.value", Value: -1}, {Key: "min.value", Value: -1}}, ""},
		{"after the metaField", D{{Key: "sensorId", Value: 1}, {Key: "value", Value: 1}}, D{{Key: "meta", Value: 1}, {Key: "min.value", Value: 1}, {Key: "max.value", Value: 1}}, ""},
		{"with the timeField", D{{Key: "value", Value: 1}, {Key: "ts", Value: -1}}, D{{Key: "min.value", Value: 1}, {Key: "max.value", Value: 1}, {Key: "start", Value: -1}}, ""},
		{"a dotted aggregate", D{{Key: "env.temp", Value: 1}}, nil, `only top-level fields can be indexed`},
		{"not an aggregate", D{{Key: "other", Value: 1}}, nil, `add a measurement to the rule's aggregates`},
		{"hashed", D{{Key: "value", Value: "hashed"}}, nil, "only 1 and -1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := rwtest.Doc(t, D{{Key: "createIndexes", Value: "readings"}, {Key: "indexes", Value: A{idx("n", c.app)}}, {Key: "$db", Value: "iot"}})
			got, err := PlanCreateIndexes(body, rule, false)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rwtest.AssertDoc(t, "createIndexes", got, D{{Key: "createIndexes", Value: "readings.buckets"}, {Key: "indexes", Value: A{idx("n", c.up)}}, {Key: "$db", Value: "iot"}})
			listed := ListIndexesReply(rwtest.CursorReply(t, 0, append(D{{Key: "v", Value: 2}}, idx("n", c.up)...)), rule, false)
			rwtest.AssertDoc(t, "listIndexes", listed, D{{Key: "cursor", Value: D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}, {Key: "firstBatch", Value: A{
				append(D{{Key: "v", Value: 2}}, idx("n", c.app)...),
			}}}}, {Key: "ok", Value: 1.0}})
		})
	}
	odd := ListIndexesReply(rwtest.CursorReply(t, 0, D{{Key: "v", Value: 2}, {Key: "key", Value: D{{Key: "min.value", Value: 1}}}, {Key: "name", Value: "half"}}), rule, false)
	rwtest.AssertDoc(t, "listIndexes of a min alone", odd, D{{Key: "cursor", Value: D{{Key: "id", Value: int64(0)}, {Key: "ns", Value: "iot.readings"}, {Key: "firstBatch", Value: A{}}}}, {Key: "ok", Value: 1.0}})
}
