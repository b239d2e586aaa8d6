#!/usr/bin/env bash
# Which files of proxy/ a per-event insert (the Go driver's InsertOne,
# retryable, into a staged rule on the embedded upstream) runs code in:
# coverage counts of 100 warm-up inserts against 1,100, by block; a
# block run at least 900 more times is on the insert's path.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" proxy/zz_insertpath_test.go' EXIT
cat > proxy/zz_insertpath_test.go <<'GO'
package proxy

import (
	"context"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestZZInsertPath(t *testing.T) {
	n := 100
	if os.Getenv("INSERT_PATH_MORE") != "" {
		n = 1100
	}
	_, addr := startWireProxy(t, stagedWireRule, "", nil)
	cl, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/?directConnection=true"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Disconnect(context.Background())
	coll := cl.Database("db").Collection("readings")
	day := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	for i := range n {
		if _, err := coll.InsertOne(context.Background(), bson.D{{Key: "ts", Value: day.Add(time.Duration(i) * time.Second)}, {Key: "sensor", Value: "a"}, {Key: "v", Value: i}}); err != nil {
			t.Fatal(err)
		}
	}
}
GO
go test -count=1 -covermode=count -coverpkg=./proxy/... -coverprofile="$tmp/base.out" -run TestZZInsertPath ./proxy/ >/dev/null
INSERT_PATH_MORE=1 go test -count=1 -covermode=count -coverpkg=./proxy/... -coverprofile="$tmp/more.out" -run TestZZInsertPath ./proxy/ >/dev/null
awk 'FNR==1{next} FNR==NR{a[$1]+=$3; next} {b[$1]+=$3} END{for (k in b) if (b[k]-a[k] >= 900) {split(k, p, ":"); f[p[1]]++} for (x in f) print f[x], x}' "$tmp/base.out" "$tmp/more.out" | sed 's#github.com/tsproxy/tsproxy/##' | sort -k2
echo "$(awk 'FNR==1{next} FNR==NR{a[$1]+=$3; next} {b[$1]+=$3} END{for (k in b) if (b[k]-a[k] >= 900) {split(k, p, ":"); f[p[1]]++} print length(f)}' "$tmp/base.out" "$tmp/more.out") files"
