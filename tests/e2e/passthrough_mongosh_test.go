package e2e

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// mongoshCRUD is run by the real mongosh (its Node.js driver inside),
// connected with a URI that names the proxy alone. It prints one JSON line.
const mongoshCRUD = `
const sdb = connect(process.env.TSPROXY_URI + process.env.TSPROXY_DB);
const out = {};
const hello = sdb.hello();
out.helloMsg = hello.msg;
out.helloHasHosts = "hosts" in hello || "setName" in hello || "me" in hello;
out.insertMany = Object.keys(sdb.readings.insertMany([
  {_id: 1, sensor: "a", v: 10},
  {_id: 2, sensor: "b", v: 20},
  {_id: 3, sensor: "a", v: 30},
  {_id: 4, sensor: "c", v: 40},
]).insertedIds).length;
out.insertOne = sdb.readings.insertOne({_id: 5, sensor: "b", v: 50}).insertedId;
out.find = sdb.readings.find({v: {$gte: 20}}, {_id: 1}).sort({v: -1}).limit(3).batchSize(2).toArray().map(d => d._id);
const u = sdb.readings.updateMany({sensor: "a"}, {$inc: {v: 1}});
out.updateMatched = u.matchedCount;
out.updateModified = u.modifiedCount;
out.updatedA = sdb.readings.find({sensor: "a"}).sort({_id: 1}).toArray().map(d => d.v);
out.deleteOne = sdb.readings.deleteOne({_id: 4}).deletedCount;
// One accumulator per $group: FerretDB 1.24 gets several wrong.
out.agg = sdb.readings.aggregate([
  {$match: {v: {$gt: 0}}},
  {$group: {_id: "$sensor", total: {$sum: "$v"}}},
  {$sort: {_id: 1}},
]).toArray();
out.aggCount = sdb.readings.aggregate([
  {$group: {_id: "$sensor", n: {$sum: 1}}},
  {$sort: {n: -1, _id: 1}},
]).toArray().map(g => g._id + ":" + g.n);
out.createIndex = sdb.readings.createIndex({sensor: 1, v: -1});
out.indexes = sdb.readings.getIndexes().map(i => i.name).sort();
sdb.createCollection("scratch");
out.collections = sdb.getCollectionNames().sort();
out.drop = sdb.scratch.drop();
out.collectionsAfterDrop = sdb.getCollectionNames().sort();
out.count = sdb.readings.countDocuments({});
let err = null;
try { sdb.readings.insertOne({_id: 1}); } catch (e) { err = e.code; }
out.dupCode = err;
print(JSON.stringify(out));
`

// TestPassthroughMongosh runs real mongosh through the proxy and checks
// every result it printed, then the upstream directly.
func TestPassthroughMongosh(t *testing.T) {
	t.Parallel()
	p := startProxy(t, proxyOptions{})
	db := uniqueDB(t)
	script := strings.Replace(mongoshCRUD, "process.env.TSPROXY_DB", `"`+db+`"`, 1)
	out := runMongosh(t, p.URI(), script)

	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "{") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("mongosh printed no JSON summary:\n%s", out)
	}
	type group struct {
		ID    string `json:"_id"`
		Total int    `json:"total"`
	}
	var got struct {
		HelloMsg             string   `json:"helloMsg"`
		HelloHasHosts        bool     `json:"helloHasHosts"`
		InsertMany           int      `json:"insertMany"`
		InsertOne            int      `json:"insertOne"`
		Find                 []int    `json:"find"`
		UpdateMatched        int      `json:"updateMatched"`
		UpdateModified       int      `json:"updateModified"`
		UpdatedA             []int    `json:"updatedA"`
		DeleteOne            int      `json:"deleteOne"`
		Agg                  []group  `json:"agg"`
		AggCount             []string `json:"aggCount"`
		CreateIndex          string   `json:"createIndex"`
		Indexes              []string `json:"indexes"`
		Collections          []string `json:"collections"`
		Drop                 bool     `json:"drop"`
		CollectionsAfterDrop []string `json:"collectionsAfterDrop"`
		Count                int      `json:"count"`
		DupCode              int      `json:"dupCode"`
	}
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("mongosh summary %q: %v", line, err)
	}
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	check("hello msg", got.HelloMsg, "isdbgrid")
	check("hello leaks topology", got.HelloHasHosts, false)
	check("insertMany ids", got.InsertMany, 4)
	check("insertOne id", got.InsertOne, 5)
	check("find", got.Find, []int{5, 4, 3})
	check("updateMany matched", got.UpdateMatched, 2)
	check("updateMany modified", got.UpdateModified, 2)
	check("updated a", got.UpdatedA, []int{11, 31})
	check("deleteOne", got.DeleteOne, 1)
	check("aggregate", got.Agg, []group{{"a", 42}, {"b", 70}})
	check("aggregate count", got.AggCount, []string{"a:2", "b:2"})
	check("createIndex", got.CreateIndex, "sensor_1_v_-1")
	check("indexes", got.Indexes, []string{"_id_", "sensor_1_v_-1"})
	check("collections", got.Collections, []string{"readings", "scratch"})
	check("drop", got.Drop, true)
	check("collections after drop", got.CollectionsAfterDrop, []string{"readings"})
	check("count", got.Count, 4)
	check("duplicate key code", got.DupCode, 11000)
	if t.Failed() {
		t.Logf("mongosh output:\n%s", out)
		return
	}

	// The upstream holds what mongosh wrote.
	ctx := ctxFor(t)
	cur, err := direct(t).Database(db).Collection("readings").Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		ID     int32  `bson:"_id"`
		Sensor string `bson:"sensor"`
		V      int32  `bson:"v"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		ID     int32  `bson:"_id"`
		Sensor string `bson:"sensor"`
		V      int32  `bson:"v"`
	}{{1, "a", 11}, {2, "b", 20}, {3, "a", 31}, {5, "b", 50}}
	if !reflect.DeepEqual(docs, want) {
		t.Fatalf("upstream holds %+v, want %+v", docs, want)
	}
}
