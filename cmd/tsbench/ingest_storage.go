package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
)

// What an ingest run leaves on the upstream once flushed.

// ingestStorage is what the upstream holds after the flush.
type ingestStorage struct {
	plain, bucket   collStats // collStats of the two collections
	plainN, bucketN int64     // their documents, counted
	stored          int64     // the sum of the buckets' counts
	bucketBSON      int64     // the sum of the bucket documents' BSON sizes
	leftover        []string  // staging collections left after the flush
	txns            bool      // <bucket>.stage.txns exists
	txnsDocs        int64
	indexBy         []string // the bucketed side's index bytes, collection by collection
	fills           []string // "events×buckets": how many buckets hold how many events
	docsRat, idxRat float64  // plain/bucketed: documents (counted), index bytes
}

// settled reads, straight from the upstream, what db holds once flushed:
// the collections' statistics and counts, the events in the buckets, and
// the staging collections left (any collection but the plain one, the
// bucket collection, the writer leases and the staging tier's txns).
// indexBytes, where set (the embedded upstream), sizes the _id index the
// proxy adds to its bucket collection there, which collStats leaves out.
func settled(ctx context.Context, db *mongo.Database, indexBytes func(ctx context.Context, db, coll string) (int64, error)) (ingestStorage, error) {
	var st ingestStorage
	names, err := db.ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return st, fmt.Errorf("listCollections %s: %w", db.Name(), err)
	}
	for _, name := range names {
		switch {
		case name == plainColl || name == bucketColl || name == rules.LeaseCollection:
		case isIDIndex(name): // counted with the buckets (ruleOwnStats)
		case isTxns(name):
			st.txns = true
			if st.txnsDocs, err = db.Collection(name).CountDocuments(ctx, bson.D{}); err != nil {
				return st, fmt.Errorf("count %s: %w", name, err)
			}
		default: // a staging collection, or a retired one (being merged)
			n, _ := db.Collection(name).CountDocuments(ctx, bson.D{})
			st.leftover = append(st.leftover, fmt.Sprintf("%s (%d documents)", name, n))
		}
	}
	cur, err := db.Collection(bucketColl).Aggregate(ctx, mongo.Pipeline{
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: nil}, {Key: "n", Value: bson.D{{Key: "$sum", Value: "$count"}}}}}},
	})
	if err != nil {
		return st, fmt.Errorf("sum of the bucket counts: %w", err)
	}
	var sums []bson.Raw
	if err := cur.All(ctx, &sums); err != nil {
		return st, fmt.Errorf("sum of the bucket counts: %w", err)
	}
	if len(sums) > 0 {
		st.stored, _ = sums[0].Lookup("n").AsInt64OK()
	}
	if st.fills, err = bucketFills(ctx, db.Collection(bucketColl)); err != nil {
		return st, err
	}
	if st.bucketBSON, err = bsonBytes(ctx, db.Collection(bucketColl)); err != nil {
		return st, err
	}
	if st.plainN, err = db.Collection(plainColl).CountDocuments(ctx, bson.D{}); err != nil {
		return st, fmt.Errorf("count %s: %w", plainColl, err)
	}
	if st.bucketN, err = db.Collection(bucketColl).CountDocuments(ctx, bson.D{}); err != nil {
		return st, fmt.Errorf("count %s: %w", bucketColl, err)
	}
	if st.plain, err = stats(ctx, db, plainColl); err != nil {
		return st, err
	}
	if st.bucket, err = stats(ctx, db, bucketColl); err != nil {
		return st, err
	}
	// The event-id index (one small document per bucket), the records
	// of merged retryable writes and the writer leases (with the staging
	// format record) are storage the rule's buckets need (the records
	// shrink past the retry horizon, but their collection and its index
	// stay; the leases' collection is the database's, for every rule in
	// it): counted with them, except in the bucket collection's own
	// collStats count. So is the embedded upstream's own _id index of the
	// bucket collection, which its collStats leaves out (until 2026-11-29
	// neither it nor the leases were counted).
	st.indexBy = append(st.indexBy, fmt.Sprintf("%s %d", bucketColl, st.bucket.indexSize))
	own, err := ruleOwnStats(ctx, db, bucketColl)
	if err != nil {
		return st, err
	}
	for _, o := range own {
		st.bucket.add(collStats{size: o.size, indexSize: o.indexSize})
		st.bucketN += o.count
		st.indexBy = append(st.indexBy, fmt.Sprintf("%s %d", o.name, o.indexSize))
	}
	if indexBytes != nil {
		n, err := indexBytes(ctx, db.Name(), bucketColl)
		if err != nil {
			return st, err
		}
		st.bucket.indexSize += n
		st.indexBy = append(st.indexBy, fmt.Sprintf("%s's _id index %d", bucketColl, n))
	}
	st.docsRat = ratio(st.plainN, st.bucketN)
	st.idxRat = ratio(st.plain.indexSize, st.bucket.indexSize)
	return st, nil
}

// bucketFills counts coll's buckets by their events, fullest first:
// "1000×36" is 36 buckets of 1,000 events. It shows where a run made more
// buckets than its events need.
func bucketFills(ctx context.Context, coll *mongo.Collection) ([]string, error) {
	cur, err := coll.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$count"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("bucket fills of %s: %w", coll.Name(), err)
	}
	var groups []struct {
		Events int64 `bson:"_id"`
		N      int64 `bson:"n"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return nil, fmt.Errorf("bucket fills of %s: %w", coll.Name(), err)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Events > groups[j].Events })
	fills := make([]string, len(groups))
	for i, g := range groups {
		fills[i] = fmt.Sprintf("%d×%d", g.Events, g.N)
	}
	return fills, nil
}

// bsonBytes is the sum of the BSON sizes of coll's documents: what they
// hold, apart from the pages and slack collStats counts in their storage.
func bsonBytes(ctx context.Context, coll *mongo.Collection) (int64, error) {
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", coll.Name(), err)
	}
	defer cur.Close(ctx)
	var n int64
	for cur.Next(ctx) {
		n += int64(len(cur.Current))
	}
	if err := cur.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", coll.Name(), err)
	}
	return n, nil
}

// isIDIndex says whether name is a rule's event-id index collection
// (rules.Rule.IDIndexCollection).
func isIDIndex(name string) bool {
	return strings.HasPrefix(name, "tsproxy_stage_") && strings.HasSuffix(name, "_ids")
}

// isTxns says whether name is the staging tier's small bookkeeping
// collection of merged retryable writes: <bucket>.stage.txns, or
// tsproxy_stage_<hash>_txns since staging names hold no dot.
func isTxns(name string) bool {
	return strings.HasSuffix(name, "txns") && (strings.Contains(name, ".stage.") || strings.HasPrefix(name, "tsproxy_stage_"))
}

// collStats is what collStats reports of a collection.
type collStats struct{ count, size, indexSize int64 }

// add adds o's figures to c's.
func (c *collStats) add(o collStats) {
	c.count += o.count
	c.size += o.size
	c.indexSize += o.indexSize
}

// stats reads coll's collStats.
func stats(ctx context.Context, db *mongo.Database, coll string) (collStats, error) {
	var r bson.Raw
	if err := db.RunCommand(ctx, bson.D{{Key: "collStats", Value: coll}}).Decode(&r); err != nil {
		return collStats{}, fmt.Errorf("collStats %s: %w", coll, err)
	}
	get := func(k string) int64 { v, _ := r.Lookup(k).AsInt64OK(); return v }
	return collStats{count: get("count"), size: get("size"), indexSize: get("totalIndexSize")}, nil
}

// Issue 13's storage targets for settled 1-second data: at least this many
// times fewer documents, and smaller indexes, than a plain collection.
const (
	docsTarget  = 100
	indexTarget = 30
)

// belowStorage names what of case c's settled storage misses the targets
// (docs and idx are its median ratios, plain / bucketed).
func belowStorage(c ingestCase, docs, idx float64) []string {
	var below []string
	if docs < docsTarget {
		below = append(below, fmt.Sprintf("%d/%d documents (%.0fx < %dx)", c.batch, c.conc, docs, docsTarget))
	}
	if idx < indexTarget {
		below = append(below, fmt.Sprintf("%d/%d index bytes (%.1fx < %dx)", c.batch, c.conc, idx, indexTarget))
	}
	return below
}

// ruleOwnStats is the collStats, by name, of the collections a rule keeps of
// its own beside its buckets, by the bucket collection's name: the
// event-id index, the records of merged retryable writes and the writer
// leases (those of them that exist; each tsbench case has a database of
// its own, so the leases are this rule's alone).
func ruleOwnStats(ctx context.Context, db *mongo.Database, bucketColl string) ([]namedStats, error) {
	rule := rules.Rule{BucketCollection: bucketColl}
	names, err := db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: bson.D{{Key: "$in", Value: bson.A{rule.IDIndexCollection(), stage.TxnsCollection(&rule), rules.LeaseCollection}}}}})
	if err != nil {
		return nil, fmt.Errorf("listCollections %s: %w", db.Name(), err)
	}
	sort.Strings(names)
	own := make([]namedStats, 0, len(names))
	for _, name := range names {
		st, err := stats(ctx, db, name)
		if err != nil {
			return nil, err
		}
		own = append(own, namedStats{name: name, collStats: st})
	}
	return own, nil
}

// namedStats is one collection's collStats.
type namedStats struct {
	name string
	collStats
}
