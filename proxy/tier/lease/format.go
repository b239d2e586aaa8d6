package lease

import (
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// A format record says which form of a stored document every proxy that
// may read it reads: a proxy writes a newer form only once the record
// says so, so that a proxy of an older version never meets a form it
// cannot read (MongoDB's featureCompatibilityVersion, per collection).
// It is a document {_id: "format:<coll>", ns: "format:<coll>", staged: N}
// in the database's lease collection, next to the collection's leases
// and staging announcements; what the numbers mean is the caller's.

func formatID(coll string) string { return "format:" + coll }

type formatDoc struct {
	ID     string `bson:"_id"`
	NS     string `bson:"ns"`
	Staged int    `bson:"staged"`
	// Set is when it was last written, for whoever reads it by hand.
	Set time.Time `bson:"set"`
}

// ReadFormat returns db.coll's recorded form (ok false: none recorded).
func ReadFormat(up Commander, db, coll string) (n int, ok bool, err error) {
	c := Client{Up: up, DB: db}
	reply, err := c.run(bson.D{
		{Key: "find", Value: rules.LeaseCollection},
		{Key: "filter", Value: bson.D{{Key: "_id", Value: formatID(coll)}}},
		{Key: "singleBatch", Value: true},
		{Key: "limit", Value: 1},
	})
	if err != nil {
		return 0, false, fmt.Errorf("read the format record of %s.%s: %w", db, coll, err)
	}
	var r struct {
		Cursor struct {
			FirstBatch []formatDoc `bson:"firstBatch"`
		} `bson:"cursor"`
	}
	if err := bson.Unmarshal(reply, &r); err != nil {
		return 0, false, fmt.Errorf("read the format record of %s.%s: %w", db, coll, err)
	}
	if len(r.Cursor.FirstBatch) == 0 {
		return 0, false, nil
	}
	return r.Cursor.FirstBatch[0].Staged, true, nil
}

// RecordFormat records form n for db.coll unless a form is recorded
// already, and returns the recorded one: n, or the form another proxy
// recorded first (an insert of a taken _id fails on every upstream).
func RecordFormat(up Commander, db, coll string, n int, now time.Time) (int, error) {
	c := Client{Up: up, DB: db}
	reply, err := c.run(bson.D{
		{Key: "insert", Value: rules.LeaseCollection},
		{Key: "documents", Value: bson.A{formatDoc{ID: formatID(coll), NS: formatID(coll), Staged: n, Set: now}}},
	})
	if err != nil {
		return 0, fmt.Errorf("record the format of %s.%s: %w", db, coll, err)
	}
	code, msg, failed := firstWriteError(reply)
	if !failed {
		return n, nil
	}
	if code != mongoerr.DuplicateKey {
		return 0, fmt.Errorf("record the format of %s.%s: %s (code %d)", db, coll, msg, code)
	}
	got, ok, err := ReadFormat(up, db, coll)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("record the format of %s.%s: refused as a duplicate, and no record found", db, coll)
	}
	return got, nil
}

// SetFormat records form n for db.coll, whatever was recorded, and
// returns what was (0: nothing).
func SetFormat(up Commander, db, coll string, n int, now time.Time) (was int, err error) {
	was, _, err = ReadFormat(up, db, coll)
	if err != nil {
		return 0, err
	}
	c := Client{Up: up, DB: db}
	set := bson.D{{Key: "ns", Value: formatID(coll)}, {Key: "staged", Value: n}, {Key: "set", Value: now}}
	if err := c.upsertByID(formatID(coll), set); err != nil {
		return 0, fmt.Errorf("set the format of %s.%s: %w", db, coll, err)
	}
	return was, nil
}

// Used reports whether the lease collection shows that a proxy worked on
// any of colls before: it took a writer lease named by one, or announced
// staging into one. A proxy of an older version leaves no format record,
// but one of these on an upstream whose updates are not isolated (where
// leases and announcements are used).
func Used(up Commander, db string, colls ...string) (bool, error) {
	var names bson.A
	for _, coll := range colls {
		names = append(names, coll, presenceNS(coll))
	}
	c := Client{Up: up, DB: db}
	reply, err := c.run(bson.D{
		{Key: "find", Value: rules.LeaseCollection},
		{Key: "filter", Value: bson.D{{Key: "ns", Value: bson.D{{Key: "$in", Value: names}}}}},
		{Key: "projection", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "singleBatch", Value: true},
		{Key: "limit", Value: 1},
	})
	if err != nil {
		return false, fmt.Errorf("read the leases of %s: %w", db, err)
	}
	n, err := FirstBatchLen(reply)
	if err != nil {
		return false, fmt.Errorf("read the leases of %s: %w", db, err)
	}
	return n > 0, nil
}

// FirstBatchLen counts the documents of a cursor reply's first batch.
func FirstBatchLen(reply bson.Raw) (int, error) {
	batch, ok := reply.Lookup("cursor", "firstBatch").ArrayOK()
	if !ok {
		return 0, errors.New("the reply has no cursor.firstBatch array")
	}
	vals, err := batch.Values()
	if err != nil {
		return 0, fmt.Errorf("cursor.firstBatch: %w", err)
	}
	return len(vals), nil
}
