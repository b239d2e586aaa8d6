package admin

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

func codeOf(err error) mongoerr.Code {
	var e *mongoerr.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

func TestParseTimeseriesCreate(t *testing.T) {
	ts := func(fields ...any) D {
		d := D{}
		for i := 0; i < len(fields); i += 2 {
			d = append(d, E{Key: fields[i].(string), Value: fields[i+1]})
		}
		return d
	}
	cases := []struct {
		name string
		body D
		want rules.Created
		code mongoerr.Code
		msg  string
	}{
		{name: "defaults to seconds", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t")}},
			want: rules.Created{DB: "db", Collection: "w", TimeField: "t", Declared: rules.Timeseries{Granularity: "seconds", BucketMaxSpanSeconds: 3600, BucketRoundingSeconds: 60}, SpanSeconds: 3600}},
		{name: "minutes, meta, ttl", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "metaField", "m", "granularity", "minutes")}, {Key: "expireAfterSeconds", Value: int64(60)}, {Key: "writeConcern", Value: D{}}, {Key: "$db", Value: "db"}},
			want: rules.Created{DB: "db", Collection: "w", TimeField: "t", MetaField: "m", Declared: rules.Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600}, SpanSeconds: 86400, ExpireAfterSeconds: 60}},
		{name: "hours with its own span", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "granularity", "hours", "bucketMaxSpanSeconds", int32(2592000))}},
			want: rules.Created{DB: "db", Collection: "w", TimeField: "t", Declared: rules.Timeseries{Granularity: "hours", BucketMaxSpanSeconds: 2592000, BucketRoundingSeconds: 86400}, SpanSeconds: 2592000}},
		{name: "custom", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "bucketMaxSpanSeconds", 600.0, "bucketRoundingSeconds", int64(600))}},
			want: rules.Created{DB: "db", Collection: "w", TimeField: "t", Declared: rules.Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}, SpanSeconds: 600}},
		{name: "ttl 0", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t")}, {Key: "expireAfterSeconds", Value: 0}},
			want: rules.Created{DB: "db", Collection: "w", TimeField: "t", Declared: rules.Timeseries{Granularity: "seconds", BucketMaxSpanSeconds: 3600, BucketRoundingSeconds: 60}, SpanSeconds: 3600, ExpireAtWindowEnd: true}},
		{name: "empty metaField", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "metaField", "")}},
			want: rules.Created{DB: "db", Collection: "w", TimeField: "t", Declared: rules.Timeseries{Granularity: "seconds", BucketMaxSpanSeconds: 3600, BucketRoundingSeconds: 60, EmptyMetaField: true}, SpanSeconds: 3600}},
		{name: "no timeField", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("metaField", "m")}}, code: mongoerr.IDLFailedToParse, msg: "is missing but a required field"},
		{name: "timeseries not a document", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: "t"}}, code: mongoerr.TypeMismatch, msg: "expected type 'object'"},
		{name: "timeField a number", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", 1)}}, code: mongoerr.TypeMismatch, msg: "'create.timeseries.timeField' is the wrong type 'int'"},
		{name: "meta is time", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "metaField", "t")}}, code: mongoerr.InvalidOptions, msg: "'metaField' cannot be the same as 'timeField'"},
		{name: "meta is _id", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "metaField", "_id")}}, code: mongoerr.InvalidOptions, msg: `'metaField' cannot be "_id"`},
		{name: "dotted meta", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "metaField", "a.b")}}, code: mongoerr.InvalidOptions, msg: "db.w: 'metaField' must be a top-level field"},
		{name: "dollar time", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "$t")}}, code: mongoerr.BadValue, msg: "cannot start with '$'"},
		{name: "bad granularity", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "granularity", "days")}}, code: mongoerr.BadValue, msg: "Enumeration value 'days'"},
		{name: "granularity and other span", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "granularity", "seconds", "bucketMaxSpanSeconds", 60)}}, code: mongoerr.InvalidOptions, msg: "default of 3600"},
		{name: "granularity and rounding", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "granularity", "seconds", "bucketRoundingSeconds", 60)}}, code: mongoerr.InvalidOptions, msg: "not configurable alongside the granularity"},
		{name: "span alone", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "bucketMaxSpanSeconds", 60)}}, code: mongoerr.InvalidOptions, msg: "needs to be equal"},
		{name: "unequal", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "bucketMaxSpanSeconds", 60, "bucketRoundingSeconds", 61)}}, code: mongoerr.InvalidOptions, msg: "needs to be equal"},
		{name: "zero span", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "bucketMaxSpanSeconds", 0, "bucketRoundingSeconds", 0)}}, code: mongoerr.BadValue, msg: "must be >= 1"},
		{name: "fractional span", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "bucketMaxSpanSeconds", 1.5, "bucketRoundingSeconds", 1.5)}}, code: mongoerr.TypeMismatch},
		{name: "unknown field", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t", "x", 1)}}, code: mongoerr.IDLUnknownField, msg: "'create.timeseries.x' is an unknown field."},
		{name: "negative ttl", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t")}, {Key: "expireAfterSeconds", Value: -5}}, code: mongoerr.InvalidOptions, msg: "cannot be less than 0"},
		{name: "ttl a string", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t")}, {Key: "expireAfterSeconds", Value: "1d"}}, code: mongoerr.TypeMismatch},
		{name: "capped", body: D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: ts("timeField", "t")}, {Key: "capped", Value: true}}, code: mongoerr.InvalidOptions, msg: "db.w: 'timeseries' is not allowed with 'capped'"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseTimeseriesCreate(rwtest.Doc(t, c.body), "db")
			if c.code != 0 {
				if codeOf(err) != c.code || !strings.Contains(err.Error(), c.msg) {
					t.Fatalf("err %v (code %d), want code %d with %q", err, codeOf(err), c.code, c.msg)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, %v\nwant %+v", got, err, c.want)
			}
		})
	}
}

func TestTimeseriesCollMod(t *testing.T) {
	minutes := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", MetaField: "m",
		Declared: rules.Timeseries{Granularity: "minutes"}, SpanSeconds: 86400, ExpireAfterSeconds: 60})
	custom := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t",
		Declared: rules.Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}, SpanSeconds: 600})
	atEnd := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", MetaField: "m",
		Declared: rules.Timeseries{Granularity: "minutes"}, SpanSeconds: 86400, ExpireAtWindowEnd: true})
	customLong := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t",
		Declared: rules.Timeseries{BucketMaxSpanSeconds: 7200, BucketRoundingSeconds: 7200}, SpanSeconds: 7200})
	cases := []struct {
		name  string
		rule  *rules.Rule
		body  D
		want  rules.Timeseries
		ttl   int64
		atEnd bool
		code  mongoerr.Code
	}{
		{name: "coarser", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "hours"}}}},
			want: rules.Timeseries{Granularity: "hours", BucketMaxSpanSeconds: 2592000, BucketRoundingSeconds: 86400}, ttl: 60},
		{name: "same", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "minutes"}}}, {Key: "expireAfterSeconds", Value: 7}},
			want: rules.Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600}, ttl: 7},
		{name: "ttl off", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: "off"}},
			want: rules.Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600}},
		{name: "ttl 0", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: 0}},
			want: rules.Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600}, atEnd: true},
		{name: "ttl 0 then off", rule: &atEnd, body: D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: "off"}},
			want: rules.Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600}},
		{name: "ttl 0 kept", rule: &atEnd, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "hours"}}}},
			want: rules.Timeseries{Granularity: "hours", BucketMaxSpanSeconds: 2592000, BucketRoundingSeconds: 86400}, atEnd: true},
		{name: "ttl negative", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: -10}}, code: mongoerr.InvalidOptions},
		{name: "ttl a document", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: D{}}}, code: mongoerr.TypeMismatch},
		{name: "ttl a number as a string", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: "10"}}, code: mongoerr.InvalidOptions},
		// MongoDB's timeseries_collmod.js: a granularity may come with
		// the bucketMaxSpanSeconds it stands for, not with another one
		// nor with bucketRoundingSeconds.
		{name: "granularity with its span", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 2592000}}}},
			want: rules.Timeseries{Granularity: "hours", BucketMaxSpanSeconds: 2592000, BucketRoundingSeconds: 86400}, ttl: 60},
		{name: "granularity with another span", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 2592001}}}}, code: mongoerr.InvalidOptions},
		{name: "granularity with rounding", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "hours"}, {Key: "bucketMaxSpanSeconds", Value: 2592000}, {Key: "bucketRoundingSeconds", Value: 86400}}}}, code: mongoerr.InvalidOptions},
		{name: "granularity with its span, finer", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "seconds"}, {Key: "bucketMaxSpanSeconds", Value: 3600}}}}, code: mongoerr.InvalidOptions},
		{name: "empty timeseries", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{}}},
			want: rules.Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600}, ttl: 60},
		{name: "finer", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "seconds"}}}}, code: mongoerr.InvalidOptions},
		{name: "ttl other string", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "expireAfterSeconds", Value: "on"}}, code: mongoerr.InvalidOptions},
		{name: "other option", rule: &minutes, body: D{{Key: "collMod", Value: "w"}, {Key: "validator", Value: D{}}}, code: mongoerr.InvalidOptions},
		{name: "longer custom", rule: &custom, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "bucketMaxSpanSeconds", Value: 900}, {Key: "bucketRoundingSeconds", Value: 900}}}},
			want: rules.Timeseries{BucketMaxSpanSeconds: 900, BucketRoundingSeconds: 900}},
		{name: "shorter custom", rule: &custom, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "bucketMaxSpanSeconds", Value: 60}, {Key: "bucketRoundingSeconds", Value: 60}}}}, code: mongoerr.InvalidOptions},
		// MongoDB 6.3+: custom bucketing takes a granularity of at least
		// its span, not a shorter one.
		{name: "custom to a granularity as long", rule: &custom, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "hours"}}}},
			want: rules.Timeseries{Granularity: "hours", BucketMaxSpanSeconds: 2592000, BucketRoundingSeconds: 86400}},
		{name: "custom to a shorter granularity", rule: &customLong, body: D{{Key: "collMod", Value: "w"}, {Key: "timeseries", Value: D{{Key: "granularity", Value: "seconds"}}}}, code: mongoerr.InvalidOptions},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseTimeseriesCollMod(rwtest.Doc(t, c.body), c.rule)
			if c.code != 0 {
				if codeOf(err) != c.code {
					t.Fatalf("err %v, want code %d", err, c.code)
				}
				return
			}
			if err != nil || got.Declared != c.want || got.ExpireAfterSeconds != c.ttl || got.ExpireAtWindowEnd != c.atEnd || got.SpanSeconds != int64(c.rule.Span/time.Second) {
				t.Fatalf("got %+v, %v; want %+v, ttl %d (at the window's end: %t), the span kept", got, err, c.want, c.ttl, c.atEnd)
			}
		})
	}
}

func TestCatalogEntryRoundTrip(t *testing.T) {
	for _, c := range []rules.Created{
		{DB: "db", Collection: "a.b", TimeField: "t", MetaField: "m", Declared: rules.Timeseries{Granularity: "hours", BucketMaxSpanSeconds: 2592000, BucketRoundingSeconds: 86400}, SpanSeconds: 86400, ExpireAfterSeconds: 5},
		{DB: "db", Collection: "w", TimeField: "t", Declared: rules.Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}, SpanSeconds: 600},
		{DB: "db", Collection: "z", TimeField: "t", Declared: rules.Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}, SpanSeconds: 600, ExpireAtWindowEnd: true},
		{DB: "db", Collection: "e", TimeField: "t", Declared: rules.Timeseries{Granularity: "minutes", BucketMaxSpanSeconds: 86400, BucketRoundingSeconds: 3600, EmptyMetaField: true}, SpanSeconds: 86400},
		{DB: "db", Collection: "i", TimeField: "t", MetaField: "m", Declared: rules.Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}, SpanSeconds: 600, Aggregates: []string{"value", "temp"}},
	} {
		e := CatalogEntry{Created: c, State: StateCreating, Nonce: "n1"}
		got, err := ParseCatalogEntry(e.Document())
		if c.Declared.Granularity != "" {
			// Stored by name; the spans come from the name when listed.
			e.Created.Declared.BucketMaxSpanSeconds, e.Created.Declared.BucketRoundingSeconds = 0, 0
		}
		if err != nil || !reflect.DeepEqual(got, e) {
			t.Fatalf("round trip of %+v: %+v, %v", e, got, err)
		}
	}
	bad := CatalogEntry{Created: rules.Created{DB: "db", Collection: "w", SpanSeconds: 60}, State: StateReady}
	if _, err := ParseCatalogEntry(bad.Document()); err == nil {
		t.Fatal("an entry without timeField was read")
	}
	odd := CatalogEntry{Created: rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 60}, State: "gone"}
	if _, err := ParseCatalogEntry(odd.Document()); err == nil {
		t.Fatal("an entry of unknown state was read")
	}
}

func TestTimeseriesInfo(t *testing.T) {
	created := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", MetaField: "m",
		Declared: rules.Timeseries{Granularity: "hours"}, SpanSeconds: 86400, ExpireAfterSeconds: 60})
	config := rwtest.Rule() // span 1h: shown as MongoDB's seconds
	custom := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "c", TimeField: "t",
		Declared: rules.Timeseries{BucketMaxSpanSeconds: 600, BucketRoundingSeconds: 600}, SpanSeconds: 600})
	atEnd := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "z", TimeField: "t",
		Declared: rules.Timeseries{Granularity: "hours"}, SpanSeconds: 86400, ExpireAtWindowEnd: true})
	emptyMeta := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "e", TimeField: "t",
		Declared: rules.Timeseries{Granularity: "seconds", EmptyMetaField: true}, SpanSeconds: 3600})
	for _, c := range []struct {
		rule     *rules.Rule
		nameOnly bool
		want     string
	}{
		{&emptyMeta, false, `{"name": "e","type": "timeseries","options": {"timeseries": {"timeField": "t","metaField": "","granularity": "seconds","bucketMaxSpanSeconds": {"$numberInt":"3600"}}},"info": {"readOnly": false}}`},
		{&atEnd, false, `{"name": "z","type": "timeseries","options": {"expireAfterSeconds": {"$numberLong":"0"},"timeseries": {"timeField": "t","granularity": "hours","bucketMaxSpanSeconds": {"$numberInt":"2592000"}}},"info": {"readOnly": false}}`},
		{&created, false, `{"name": "w","type": "timeseries","options": {"expireAfterSeconds": {"$numberLong":"60"},"timeseries": {"timeField": "t","metaField": "m","granularity": "hours","bucketMaxSpanSeconds": {"$numberInt":"2592000"}}},"info": {"readOnly": false}}`},
		{&created, true, `{"name": "w","type": "timeseries"}`},
		{config, false, `{"name": "readings","type": "timeseries","options": {"timeseries": {"timeField": "ts","metaField": "sensorId","granularity": "seconds","bucketMaxSpanSeconds": {"$numberInt":"3600"}}},"info": {"readOnly": false}}`},
		{&custom, false, `{"name": "c","type": "timeseries","options": {"timeseries": {"timeField": "t","bucketRoundingSeconds": {"$numberInt":"600"},"bucketMaxSpanSeconds": {"$numberInt":"600"}}},"info": {"readOnly": false}}`},
	} {
		if got := rwtest.JSON(TimeseriesInfo(c.rule, c.nameOnly)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.rule.Namespace, got, c.want)
		}
	}
}

func TestSameTimeseries(t *testing.T) {
	r := rules.NewCreatedRule(rules.Created{DB: "db", Collection: "w", TimeField: "t", MetaField: "m",
		Declared: rules.Timeseries{Granularity: "minutes"}, SpanSeconds: 86400})
	same, _ := ParseTimeseriesCreate(rwtest.Doc(t, D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: D{{Key: "timeField", Value: "t"}, {Key: "metaField", Value: "m"}, {Key: "granularity", Value: "minutes"}}}}), "db")
	other, _ := ParseTimeseriesCreate(rwtest.Doc(t, D{{Key: "create", Value: "w"}, {Key: "timeseries", Value: D{{Key: "timeField", Value: "t"}, {Key: "metaField", Value: "m"}}}}), "db")
	if !SameTimeseries(same, &r) || SameTimeseries(other, &r) {
		t.Fatal("SameTimeseries")
	}
	if err := ExistsError(other, &r); codeOf(err) != mongoerr.NamespaceExists || !strings.Contains(err.Error(), "A timeseries collection already exists. NS: db.w") {
		t.Fatal(err)
	}
}

func TestParseCatalogBatch(t *testing.T) {
	good := CatalogEntry{Created: rules.Created{DB: "db", Collection: "w", TimeField: "t", SpanSeconds: 3600}, State: StateReady, Nonce: "n"}
	reply := rwtest.Doc(t, D{{Key: "cursor", Value: D{{Key: "firstBatch", Value: A{
		good.Document(),
		D{{Key: "_id", Value: "db.x"}, {Key: "db", Value: "db"}, {Key: "coll", Value: "x"}}, // no timeField
	}}, {Key: "id", Value: int64(7)}, {Key: "ns", Value: "tsproxy.catalog"}}}, {Key: "ok", Value: 1.0}})
	entries, id, bad, err := ParseCatalogBatch(reply)
	if err != nil || id != 7 || len(entries) != 1 || !reflect.DeepEqual(entries[0], good) || len(bad) != 1 {
		t.Fatalf("%+v %d %v %v", entries, id, bad, err)
	}
	refused := rwtest.Doc(t, D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "not authorized"}, {Key: "code", Value: 13}})
	if _, _, _, err := ParseCatalogBatch(refused); err == nil || !strings.Contains(err.Error(), "not authorized") {
		t.Fatalf("a refusal: %v", err)
	}
}
