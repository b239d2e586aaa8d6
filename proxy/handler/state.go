package handler

import (
	"sync"

	"github.com/tsproxy/tsproxy/proxy/fills"

	"github.com/tsproxy/tsproxy/rewrite/hello"
	"github.com/tsproxy/tsproxy/rewrite/read"

	"github.com/tsproxy/tsproxy/rewrite/caps"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// upstreamState is what the proxy learns about its upstream and shares
// across client connections: its limits (from hello), what it supports
// (detected once, on the first rewrite), and which bucket collections
// have their index.
type upstreamState struct {
	mu       sync.Mutex
	limits   hello.RouterHelloLimits
	caps     *caps.Upstream
	isFerret bool
	// idLookups: what a find by _id on a bucket collection costs (see
	// read.Options.IDLookups); nil until probed.
	idLookups *read.IDLookupCost
	buckets   *fills.Cache // fills of open buckets
	// writeSlots bounds the bucket update commands running at once on an
	// upstream with Caps.MaxUpdateStatements (FerretDB).
	writeSlots chan struct{}
}

func newUpstreamState() *upstreamState {
	return &upstreamState{limits: defaultLimits,
		writeSlots: make(chan struct{}, caps.FerretDBWriteSlots)}
}

func (u *upstreamState) rememberHello(r bson.Raw) {
	if ok, _ := r.Lookup("ok").AsFloat64OK(); ok != 1 {
		return
	}
	l := u.helloLimits()
	set := func(dst *int32, key string) {
		if v, ok := r.Lookup(key).AsInt64OK(); ok {
			*dst = int32(v)
		}
	}
	set(&l.MinWireVersion, "minWireVersion")
	set(&l.MaxWireVersion, "maxWireVersion")
	set(&l.MaxBSONObjectSize, "maxBsonObjectSize")
	set(&l.MaxMessageSizeBytes, "maxMessageSizeBytes")
	set(&l.MaxWriteBatchSize, "maxWriteBatchSize")
	set(&l.LogicalSessionTimeoutMinutes, "logicalSessionTimeoutMinutes")
	u.mu.Lock()
	u.limits = l
	u.mu.Unlock()
}

func (u *upstreamState) helloLimits() hello.RouterHelloLimits {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.limits
}

// forgetBuckets forgets what the proxy knows of the buckets in bucketNS
// ("db.collection" of a rule's bucket collection). Call it when that
// collection is dropped (or renamed, or emptied outside the proxy), so the
// next insert finds the buckets again by point reads.
func (u *upstreamState) forgetBuckets(bucketNS string) {
	u.bucketCache().Forget(bucketNS)
}

func (u *upstreamState) bucketCache() *fills.Cache {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.buckets == nil {
		u.buckets = fills.New(fills.DefaultSize)
	}
	return u.buckets
}
