package lease

import (
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"github.com/tsproxy/tsproxy/upstream"
)

// Commander runs one command upstream (an *upstream.Conn), through
// proxy/exec.
type Commander = exec.Commander

// Client runs the lease commands of one namespace on one upstream
// connection.
type Client struct {
	Up    Commander
	DB    string
	Coll  string // the leased collection
	Owner string
	TTL   time.Duration
}

type leaseDoc struct {
	ID      string    `bson:"_id"`
	NS      string    `bson:"ns"`
	Term    int64     `bson:"term"`
	Owner   string    `bson:"owner"`
	Expires time.Time `bson:"expires"`
	// Released is when its holder gave the term up (Release); its writes
	// began before then, though Expires was set back to let others in.
	Released time.Time `bson:"released,omitempty"`
}

// ended is when the term's last write began at the latest.
func (d *leaseDoc) ended() time.Time {
	if d.Released.After(d.Expires) {
		return d.Released
	}
	return d.Expires
}

func (c Client) id(term int64) string { return fmt.Sprintf("%s#%d", c.Coll, term) }

// latest reads the namespace's lease document of the highest term.
func (c Client) latest() (*leaseDoc, error) {
	reply, err := c.run(bson.D{
		{Key: "find", Value: rules.LeaseCollection},
		{Key: "filter", Value: bson.D{{Key: "ns", Value: c.Coll}}},
		{Key: "singleBatch", Value: true},
		{Key: "batchSize", Value: 1000},
	})
	if err != nil {
		return nil, err
	}
	var r struct {
		Cursor struct {
			FirstBatch []leaseDoc `bson:"firstBatch"`
		} `bson:"cursor"`
	}
	if err := bson.Unmarshal(reply, &r); err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	var top *leaseDoc
	for i := range r.Cursor.FirstBatch {
		if d := &r.Cursor.FirstBatch[i]; top == nil || d.Term > top.Term {
			top = d
		}
	}
	return top, nil
}

// Taken is a term Take took.
type Taken struct {
	Term int64
	// PreviousEnd is when the term before it ran out or was released
	// (zero when it is the first): the previous holder began its last
	// write before that.
	PreviousEnd time.Time
}

// Take inserts the next term when the lease is free, lapsed or already
// this proxy's; otherwise it returns who holds it.
func (c Client) Take(now time.Time) (Taken, *HeldError, error) {
	top, err := c.latest()
	if err != nil {
		return Taken{}, nil, err
	}
	next := int64(1)
	var prev time.Time
	if top != nil {
		prev = top.ended()
		if top.Owner != c.Owner && now.Before(top.Expires.Add(c.TTL/6)) {
			return Taken{}, &HeldError{Owner: top.Owner, Expires: top.Expires}, nil
		}
		next = top.Term + 1
	}
	reply, err := c.run(bson.D{
		{Key: "insert", Value: rules.LeaseCollection},
		{Key: "documents", Value: bson.A{leaseDoc{ID: c.id(next), NS: c.Coll, Term: next, Owner: c.Owner, Expires: now.Add(c.TTL)}}},
	})
	if err != nil {
		return Taken{}, nil, err
	}
	if code, msg, failed := firstWriteError(reply); failed {
		if code != mongoerr.DuplicateKey {
			return Taken{}, nil, fmt.Errorf("insert lease %s: %s (code %d)", c.id(next), msg, code)
		}
		// Another proxy inserted this term first: it holds the lease.
		if top, err = c.latest(); err != nil {
			return Taken{}, nil, err
		}
		if top == nil {
			return Taken{}, nil, errors.New("lease insert refused and no lease found")
		}
		return Taken{}, &HeldError{Owner: top.Owner, Expires: top.Expires}, nil
	}
	// Earlier terms are history; a failure to remove them costs nothing.
	_, _ = c.run(bson.D{
		{Key: "delete", Value: rules.LeaseCollection},
		{Key: "deletes", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "ns", Value: c.Coll}, {Key: "term", Value: bson.D{{Key: "$lt", Value: next}}}}},
			{Key: "limit", Value: 0},
		}}},
	})
	return Taken{Term: next, PreviousEnd: prev}, nil, nil
}

// firstWriteError returns the code and message of a reply's first write
// error.
func firstWriteError(reply bson.Raw) (mongoerr.Code, string, bool) {
	arr, ok := reply.Lookup("writeErrors").ArrayOK()
	if !ok {
		return 0, "", false
	}
	vals, err := arr.Values()
	if err != nil || len(vals) == 0 {
		return 0, "", false
	}
	d, _ := vals[0].DocumentOK()
	code, _ := d.Lookup("code").AsInt64OK()
	msg, _ := d.Lookup("errmsg").StringValueOK()
	return mongoerr.Code(code), msg, true
}

// Renew moves the expiry of the held term on and checks that no later
// term exists (ErrLost when one does).
func (c Client) Renew(term int64, now time.Time) error {
	reply, err := c.run(bson.D{
		{Key: "update", Value: rules.LeaseCollection},
		{Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: c.id(term)}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: now.Add(c.TTL)}}}}},
		}}},
	})
	if err != nil {
		return err
	}
	if n, _ := reply.Lookup("n").AsInt64OK(); n != 1 {
		return ErrLost
	}
	top, err := c.latest()
	if err != nil {
		return err
	}
	if top == nil || top.Term != term {
		return ErrLost
	}
	return nil
}

// Release ends the held term now, so another proxy may take over at once.
func (c Client) Release(term int64, now time.Time) error {
	_, err := c.run(bson.D{
		{Key: "update", Value: rules.LeaseCollection},
		{Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: c.id(term)}, {Key: "owner", Value: c.Owner}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "expires", Value: time.Unix(0, 0)}, {Key: "released", Value: now}}}}},
		}}},
	})
	return err
}

// upsertByID sets the fields of set on the lease collection's document
// id, inserting it when missing. Two upserts of one missing document at
// once (two connections announcing, two proxies setting a format) may
// both insert on FerretDB, and the second meets a duplicate key; the
// document is there by then, so the same upsert again updates it.
func (c Client) upsertByID(id string, set bson.D) error {
	cmd := bson.D{
		{Key: "update", Value: rules.LeaseCollection},
		{Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: id}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: set}}},
			{Key: "upsert", Value: true},
		}}},
	}
	for attempt := 0; ; attempt++ {
		reply, err := c.run(cmd)
		if err != nil {
			return err
		}
		code, msg, failed := firstWriteError(reply)
		if failed && code == mongoerr.DuplicateKey && attempt == 0 {
			continue
		}
		if failed {
			return fmt.Errorf("%s (code %d)", msg, code)
		}
		return nil
	}
}

// run sends cmd to the lease database and returns the reply, or the
// upstream's refusal as an error.
func (c Client) run(cmd bson.D) (bson.Raw, error) {
	reply, err := exec.RunDoc(c.Up, append(cmd, bson.E{Key: "$db", Value: c.DB}))
	if err != nil {
		return nil, err
	}
	if err := upstream.CommandError(reply); err != nil {
		return nil, err
	}
	return reply, nil
}
