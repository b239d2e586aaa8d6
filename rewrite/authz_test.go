package rewrite_test

import (
	"testing"

	"github.com/tsproxy/tsproxy/rewrite"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestParseConnectionStatus(t *testing.T) {
	mongo, _ := bson.Marshal(bson.D{
		{Key: "authInfo", Value: bson.D{
			{Key: "authenticatedUsers", Value: bson.A{
				bson.D{{Key: "user", Value: "ingest"}, {Key: "db", Value: "iot"}},
				bson.D{{Key: "user", Value: "admin"}, {Key: "db", Value: "admin"}},
			}},
			{Key: "authenticatedUserPrivileges", Value: bson.A{
				bson.D{{Key: "resource", Value: bson.D{{Key: "db", Value: "iot"}, {Key: "collection", Value: ""}}},
					{Key: "actions", Value: bson.A{"find", "insert"}}},
				bson.D{{Key: "resource", Value: bson.D{{Key: "db", Value: "logs"}, {Key: "collection", Value: "hits"}}},
					{Key: "actions", Value: bson.A{"remove"}}},
				bson.D{{Key: "resource", Value: bson.D{{Key: "cluster", Value: true}}},
					{Key: "actions", Value: bson.A{"remove", "update"}}},
			}},
		}},
		{Key: "ok", Value: 1.0},
	})
	info, err := rewrite.ParseConnectionStatus(mongo)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Users) != 2 || info.Users[0] != "admin@admin" || info.Users[1] != "ingest@iot" {
		t.Fatalf("users %v", info.Users)
	}
	cases := []struct {
		action   rewrite.Action
		db, coll string
		want     bool
	}{
		{rewrite.ActionInsert, "iot", "readings", true},
		{rewrite.ActionInsert, "iot", "readings.buckets", true},
		{rewrite.ActionInsert, "iot", "system.views", false}, // system collections need naming
		{rewrite.ActionRemove, "iot", "readings", false},     // the cluster resource grants no collection
		{rewrite.ActionUpdate, "iot", "readings", false},
		{rewrite.ActionRemove, "logs", "hits", true},
		{rewrite.ActionRemove, "logs", "other", false},
		{rewrite.ActionFind, "other", "readings", false},
		// A reader and writer of iot may not create, drop or change its
		// time-series collections.
		{rewrite.ActionDropCollection, "iot", "readings", false},
		{rewrite.ActionCreateCollection, "iot", "readings", false},
		{rewrite.ActionCollMod, "iot", "readings", false},
	}
	for _, tc := range cases {
		if got := info.Allows(tc.action, tc.db, tc.coll); got != tc.want {
			t.Errorf("Allows(%s, %s.%s) = %v, want %v", tc.action, tc.db, tc.coll, got, tc.want)
		}
	}

	// FerretDB reports users but no privileges: its users may run anything.
	ferret, _ := bson.Marshal(bson.D{{Key: "authInfo", Value: bson.D{
		{Key: "authenticatedUsers", Value: bson.A{bson.D{{Key: "user", Value: "u"}, {Key: "db", Value: "admin"}}}},
		{Key: "authenticatedUserRoles", Value: bson.A{}}}}, {Key: "ok", Value: 1.0}})
	info, err = rewrite.ParseConnectionStatus(ferret)
	if err != nil || len(info.Users) != 1 || info.Privileges != nil || !info.Allows(rewrite.ActionRemove, "x", "y") {
		t.Fatalf("FerretDB's reply: %+v %v", info, err)
	}
	bad, _ := bson.Marshal(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "no"}, {Key: "code", Value: 13}})
	if _, err := rewrite.ParseConnectionStatus(bad); err == nil {
		t.Fatal("an error reply parsed")
	}
}

func TestActionOf(t *testing.T) {
	for name, want := range map[string]rewrite.Action{
		"find": rewrite.ActionFind, "aggregate": rewrite.ActionFind, "insert": rewrite.ActionInsert,
		"delete": rewrite.ActionRemove, "update": rewrite.ActionUpdate, "findAndModify": rewrite.ActionUpdate,
		"create": rewrite.ActionCreateCollection, "drop": rewrite.ActionDropCollection, "collMod": rewrite.ActionCollMod,
	} {
		if got := rewrite.ActionOf(name); got != want {
			t.Errorf("ActionOf(%s) = %s, want %s", name, got, want)
		}
	}
}

func TestCoauthorized(t *testing.T) {
	cases := []struct {
		owners, others []string
		want           bool
	}{
		{nil, nil, true},
		{nil, []string{"a@admin"}, true},
		{[]string{"a@admin"}, nil, false},
		{[]string{"a@admin"}, []string{"b@admin"}, false},
		{[]string{"a@admin", "b@admin"}, []string{"b@admin"}, true},
	}
	for _, tc := range cases {
		if got := rewrite.Coauthorized(tc.owners, tc.others); got != tc.want {
			t.Errorf("Coauthorized(%v, %v) = %v", tc.owners, tc.others, got)
		}
	}
}

func TestIsUnauthorized(t *testing.T) {
	for _, tc := range []struct {
		reply bson.D
		want  bool
	}{
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(13)}}, true},
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(18)}}, true},
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(26)}}, false},
		{bson.D{{Key: "ok", Value: 1.0}}, false},
	} {
		b, _ := bson.Marshal(tc.reply)
		if got := rewrite.IsUnauthorized(b); got != tc.want {
			t.Errorf("IsUnauthorized(%v) = %v", tc.reply, got)
		}
	}
}
