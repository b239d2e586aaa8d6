package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// stagingFormat runs tsproxyStagingFormat on ns through c, with set when
// it is not 0, and returns the rule's entry of the reply and the reply.
func stagingFormat(t *testing.T, ctx context.Context, c *mongo.Client, ns string, set int) (bson.M, bson.M) {
	t.Helper()
	cmd := bson.D{{Key: "tsproxyStagingFormat", Value: ns}}
	if set != 0 {
		cmd = append(cmd, bson.E{Key: "set", Value: set})
	}
	var out bson.M
	var r struct {
		Rules []bson.M `bson:"rules"`
	}
	res := c.Database("admin").RunCommand(ctx, cmd)
	if err := res.Decode(&out); err != nil {
		t.Fatalf("tsproxyStagingFormat %v: %v", cmd, err)
	}
	if err := res.Decode(&r); err != nil || len(r.Rules) != 1 {
		t.Fatalf("tsproxyStagingFormat %v: reply %v (%v), want one rule", cmd, out, err)
	}
	return r.Rules[0], out
}

// stagedForms counts db's staged documents on the upstream by form: with
// a group at their top (meta: form 1) or with all their groups packed
// (more without meta: form 2).
func stagedForms(t *testing.T, ctx context.Context, db string) (keyed, packed int) {
	t.Helper()
	up := connect(t, env.upstreamURI).Database(db)
	for _, name := range stagingNames(t, ctx, db) {
		for _, d := range rawDocs(t, ctx, up.Collection(name)) {
			if _, ok := d.Lookup("_id").StringValueOK(); ok {
				continue // the proxy's marker of what it kept (kept.go)
			}
			_, meta := d.LookupErr("meta")
			_, more := d.LookupErr("more")
			switch {
			case meta == nil:
				keyed++
			case more == nil:
				packed++
			default:
				t.Fatalf("staged document in %s of neither form: %s", name, d)
			}
		}
	}
	return keyed, packed
}

// TestStageFormat: a rule no proxy worked on before gets the latest
// staged document form (two fields for a per-event insert), on both
// proxies that stage it; tsproxyStagingFormat lowers it (merging what
// was staged in the higher form before it answers, so that a proxy of
// an older version may join) and raises it again; documents of both
// forms merge into the same buckets, every event once. A rule that an
// older proxy worked on (its writer lease, with no format record)
// stages in the form every version reads.
func TestStageFormat(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	db := uniqueDB(t)
	ns := db + ".readings"
	p := startProxy(t, proxyOptions{yaml: stagedRule(db, 1000, "1h")})
	c := connect(t, p.URI())
	coll := c.Database(db).Collection("readings")
	base := time.Date(2026, 3, 6, 0, 0, 0, 0, time.UTC)
	evs := seriesEvents(30, "a", base)
	insertEach := func(part []sentEvent) {
		t.Helper()
		for _, e := range part {
			if _, err := coll.InsertOne(ctx, e.doc()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A second proxy stages the rule too: it reads the record the first
	// made, and sees it lowered by the time the first answers.
	other := connect(t, startProxy(t, proxyOptions{yaml: stagedRule(db, 1000, "1h")}).URI()).Database(db).Collection("readings")
	insertOther := func(e sentEvent) {
		t.Helper()
		if _, err := other.InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
	}
	insertEach(evs[:9])
	insertOther(evs[9])
	if keyed, packed := stagedForms(t, ctx, db); keyed != 0 || packed != 10 {
		t.Fatalf("a new rule staged %d documents with a group at the top, %d packed; want 0 and 10", keyed, packed)
	}
	if got, _ := stagingFormat(t, ctx, c, ns, 0); asInt(got["format"]) != 2 || got["recorded"] != true {
		t.Fatalf("a new rule's format: %v, want 2, recorded", got)
	}

	got, reply := stagingFormat(t, ctx, c, ns, 1)
	// mergedEvents counts what this proxy merged, none when the other
	// holds the writer lease (flush.go); no staging left says that
	// everything staged in form 2 was merged.
	if asInt(got["was"]) != 2 || asInt(got["format"]) != 1 || asInt(reply["mergedEvents"]) > 10 {
		t.Fatalf("lowering the format: %v (reply %v), want was 2, format 1, at most 10 events merged", got, reply)
	}
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging left after the format was lowered: %v", left)
	}
	insertEach(evs[10:19])
	insertOther(evs[19])
	if keyed, packed := stagedForms(t, ctx, db); keyed != 10 || packed != 0 {
		t.Fatalf("after lowering: %d staged documents with a group at the top, %d packed; want 10 and 0", keyed, packed)
	}
	if got, _ := stagingFormat(t, ctx, c, ns, 2); asInt(got["was"]) != 1 || asInt(got["format"]) != 2 {
		t.Fatalf("raising the format: %v, want was 1, format 2", got)
	}
	insertEach(evs[20:])
	if keyed, packed := stagedForms(t, ctx, db); keyed != 10 || packed != 10 {
		t.Fatalf("after raising: %d staged documents with a group at the top, %d packed; want 10 and 10", keyed, packed)
	}
	flush(t, ctx, c, ns)
	if left := stagingNames(t, ctx, db); len(left) != 0 {
		t.Fatalf("staging left after a flush of both forms: %v", left)
	}
	checkStored(t, readBuckets(t, ctx, db), evs, 1000)
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 30 {
		t.Fatalf("the proxy counts %d events (%v), want 30", n, err)
	}

	for _, bad := range []bson.D{
		{{Key: "tsproxyStagingFormat", Value: ns}, {Key: "set", Value: 3}},
		{{Key: "tsproxyStagingFormat", Value: ns}, {Key: "set", Value: "2"}},
		{{Key: "tsproxyStagingFormat", Value: "nodb.norule"}},
		{{Key: "tsproxyStagingFormat", Value: 2}},
	} {
		err := c.Database("admin").RunCommand(ctx, bad).Err()
		if err == nil || !(strings.Contains(err.Error(), "set takes") || strings.Contains(err.Error(), "no rule") || strings.Contains(err.Error(), "takes 1")) {
			t.Errorf("%v: %v, want an error naming what is wrong", bad, err)
		}
	}

	// A rule an older proxy held the writer lease of, and left no record.
	old := uniqueDB(t)
	lease := bson.D{{Key: "_id", Value: "readings#1"}, {Key: "ns", Value: "readings"}, {Key: "term", Value: int64(1)},
		{Key: "owner", Value: "an older proxy"}, {Key: "expires", Value: time.Now().Add(-time.Hour)}}
	if _, err := connect(t, env.upstreamURI).Database(old).Collection("tsproxy_leases").InsertOne(ctx, lease); err != nil {
		t.Fatal(err)
	}
	p2 := startProxy(t, proxyOptions{yaml: stagedRule(old, 1000, "1h")})
	c2 := connect(t, p2.URI())
	oldEvs := seriesEvents(5, "b", base)
	for _, e := range oldEvs {
		if _, err := c2.Database(old).Collection("readings").InsertOne(ctx, e.doc()); err != nil {
			t.Fatal(err)
		}
	}
	if keyed, packed := stagedForms(t, ctx, old); keyed != 5 || packed != 0 {
		t.Fatalf("a rule an older proxy worked on staged %d documents with a group at the top, %d packed; want 5 and 0", keyed, packed)
	}
	if got, _ := stagingFormat(t, ctx, c2, old+".readings", 0); asInt(got["format"]) != 1 {
		t.Fatalf("a rule an older proxy worked on: format %v, want 1", got)
	}
	flush(t, ctx, c2, old+".readings")
	checkStored(t, readBuckets(t, ctx, old), oldEvs, 1000)
}

// rawDocs reads every document of c, as stored.
func rawDocs(t *testing.T, ctx context.Context, c *mongo.Collection) []bson.Raw {
	t.Helper()
	cur, err := c.Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	return docs
}
