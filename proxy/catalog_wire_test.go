package proxy

import (
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func mustOK(t *testing.T, what string, r bson.Raw) {
	t.Helper()
	if ok, _ := r.Lookup("ok").AsFloat64OK(); ok != 1 {
		t.Fatalf("%s: %s", what, r)
	}
}

func listedColls(t *testing.T, c *wireClient, db string) []bson.Raw {
	t.Helper()
	r := c.cmd(bson.D{{Key: "listCollections", Value: 1}, {Key: "$db", Value: db}})
	mustOK(t, "listCollections", r)
	vals, _ := r.Lookup("cursor", "firstBatch").Array().Values()
	var out []bson.Raw
	for _, v := range vals {
		out = append(out, v.Document())
	}
	return out
}

func catalogEntries(t *testing.T, c *wireClient) []bson.Raw {
	t.Helper()
	r := c.cmd(bson.D{{Key: "find", Value: "catalog"}, {Key: "$db", Value: "tsproxy"}})
	vals, _ := r.Lookup("cursor", "firstBatch").Array().Values()
	var out []bson.Raw
	for _, v := range vals {
		out = append(out, v.Document())
	}
	return out
}

// A dropDatabase that runs while a collMod of one of the database's
// time-series collections waits out its lease: both are acknowledged, and
// the catalog entry must not survive the database.
func TestDropDatabaseDuringCollMod(t *testing.T) {
	_, addr := startWireProxy(t, "", "", nil)
	c := dialWire(t, addr)
	mustOK(t, "create", c.cmd(bson.D{{Key: "create", Value: "m"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "ts"}, {Key: "metaField", Value: "s"}}}, {Key: "$db", Value: "rdb"}}))
	time.Sleep(1100 * time.Millisecond)
	// A command on the namespace: this proxy's snapshot is read now.
	c.cmd(bson.D{{Key: "find", Value: "m"}, {Key: "$db", Value: "rdb"}})

	var wg sync.WaitGroup
	var mod bson.Raw
	wg.Add(1)
	go func() {
		defer wg.Done()
		c2 := dialWire(t, addr)
		mod = c2.cmd(bson.D{{Key: "collMod", Value: "m"}, {Key: "expireAfterSeconds", Value: int64(3600)}, {Key: "$db", Value: "rdb"}})
	}()
	time.Sleep(100 * time.Millisecond)
	c3 := dialWire(t, addr)
	dd := c3.cmd(bson.D{{Key: "dropDatabase", Value: 1}, {Key: "$db", Value: "rdb"}})
	wg.Wait()
	t.Logf("collMod: %s", mod)
	t.Logf("dropDatabase: %s", dd)
	mustOK(t, "dropDatabase", dd)
	time.Sleep(1500 * time.Millisecond)
	// The database is gone: a plain collection of the name may be created.
	if r := c.cmd(bson.D{{Key: "create", Value: "m"}, {Key: "$db", Value: "rdb"}}); r.Lookup("ok").Double() != 1 {
		t.Errorf("create of a plain rdb.m after dropDatabase: %s", r)
	}
	if cat := catalogEntries(t, c); len(cat) != 0 {
		t.Errorf("after dropDatabase acknowledged, the catalog still holds %v", cat)
	}
}

// listCollections filtered on the fields the proxy makes up (type,
// options.timeseries) must select the created time-series collection as
// MongoDB's listCollections does: db.getCollectionInfos({type: "timeseries"}).
func TestListCollectionsTypeFilter(t *testing.T) {
	_, addr := startWireProxy(t, "", "", nil)
	c := dialWire(t, addr)
	mustOK(t, "create", c.cmd(bson.D{{Key: "create", Value: "m"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "ts"}, {Key: "metaField", Value: "s"}}}, {Key: "$db", Value: "ldb"}}))
	mustOK(t, "insert", c.cmd(bson.D{{Key: "insert", Value: "m"}, {Key: "documents", Value: bson.A{bson.D{{Key: "ts", Value: bson.DateTime(time.Now().UnixMilli())}, {Key: "s", Value: 1}}}}, {Key: "$db", Value: "ldb"}}))
	mustOK(t, "create plain", c.cmd(bson.D{{Key: "create", Value: "plain"}, {Key: "$db", Value: "ldb"}}))
	list := func(filter bson.D) []string {
		r := c.cmd(bson.D{{Key: "listCollections", Value: 1}, {Key: "filter", Value: filter}, {Key: "$db", Value: "ldb"}})
		mustOK(t, "listCollections", r)
		vals, _ := r.Lookup("cursor", "firstBatch").Array().Values()
		var names []string
		for _, v := range vals {
			names = append(names, v.Document().Lookup("name").StringValue()+"/"+v.Document().Lookup("type").StringValue())
		}
		return names
	}
	if got := list(bson.D{}); len(got) != 2 {
		t.Fatalf("unfiltered: %v", got)
	}
	if got := list(bson.D{{Key: "type", Value: "timeseries"}}); len(got) != 1 || got[0] != "m/timeseries" {
		t.Errorf("filter {type: \"timeseries\"}: %v, want [m/timeseries]", got)
	}
	if got := list(bson.D{{Key: "type", Value: "collection"}}); len(got) != 1 || got[0] != "plain/collection" {
		t.Errorf("filter {type: \"collection\"}: %v, want [plain/collection]", got)
	}
}

// A create of a time-series collection acknowledged while a dropDatabase of
// its database waits out its lease, then an event inserted into it: the
// dropDatabase drops the new bucket collection (and the event) but leaves
// the catalog entry ready. No serial order of create, insert, dropDatabase
// gives that: either the collection is gone, or it exists with its event.
func TestDropDatabaseAfterConcurrentCreate(t *testing.T) {
	_, addr := startWireProxy(t, "", "", nil)
	c := dialWire(t, addr)
	tsCreate := func(c *wireClient, coll string) bson.Raw {
		return c.cmd(bson.D{{Key: "create", Value: coll}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "ts"}}}, {Key: "$db", Value: "cdb"}})
	}
	mustOK(t, "create a", tsCreate(c, "a"))

	var wg sync.WaitGroup
	var created, inserted bson.Raw
	wg.Add(1)
	go func() {
		defer wg.Done()
		c2 := dialWire(t, addr)
		created = tsCreate(c2, "b")
		inserted = c2.cmd(bson.D{{Key: "insert", Value: "b"}, {Key: "documents", Value: bson.A{bson.D{{Key: "ts", Value: bson.DateTime(time.Now().UnixMilli())}, {Key: "v", Value: 1}}}}, {Key: "$db", Value: "cdb"}})
	}()
	time.Sleep(1500 * time.Millisecond)
	c3 := dialWire(t, addr)
	dd := c3.cmd(bson.D{{Key: "dropDatabase", Value: 1}, {Key: "$db", Value: "cdb"}})
	wg.Wait()
	mustOK(t, "create b", created)
	mustOK(t, "insert b", inserted)
	mustOK(t, "dropDatabase", dd)
	time.Sleep(1500 * time.Millisecond)
	cat := catalogEntries(t, c)
	if len(cat) == 0 {
		return // the collection is gone: consistent
	}
	count := c.cmd(bson.D{{Key: "count", Value: "b"}, {Key: "$db", Value: "cdb"}})
	listed := listedColls(t, c, "cdb")
	t.Errorf("after dropDatabase the catalog still holds %v; cdb lists %v and count of cdb.b is %s (its acknowledged event is gone)", cat, listed, count)
}

// A create without the timeseries option, with options of a plain
// collection (capped, validator...), of an existing time-series collection:
// MongoDB answers NamespaceExists (48), as for any create of an existing
// name with other options; the proxy complains that 'timeseries' (which
// the command does not have) is not allowed with them.
func TestPlainCreateWithOptionsOverTimeseries(t *testing.T) {
	_, addr := startWireProxy(t, "", "", nil)
	c := dialWire(t, addr)
	mustOK(t, "create", c.cmd(bson.D{{Key: "create", Value: "m"}, {Key: "timeseries", Value: bson.D{{Key: "timeField", Value: "ts"}}}, {Key: "$db", Value: "pdb"}}))
	r := c.cmd(bson.D{{Key: "create", Value: "m"}, {Key: "capped", Value: true}, {Key: "size", Value: 4096}, {Key: "$db", Value: "pdb"}})
	if code, _ := r.Lookup("code").AsInt64OK(); code != 48 {
		t.Errorf("create {capped: true} of the time-series pdb.m: %s, want NamespaceExists (48)", r)
	}
}
