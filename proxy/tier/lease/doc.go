// Package lease is the writer lease of a bucketed namespace: on an upstream
// whose updates are not isolated from each other, only the proxy holding a
// namespace's lease writes it.
//
// On an upstream whose updates are not isolated from each other
// (caps.Upstream.SingleWriter: FerretDB v1.24 reads a document, changes it
// in Go and writes it back by _id), two proxies updating the same bucket
// at once lose one of the updates: measured, two proxies writing one
// series lost 81 of 2,400 acknowledged events. One proxy's own writers
// are serialized by its series locks; across proxies nothing is. So on
// such an upstream a proxy writes a bucketed namespace only while it holds
// that namespace's writer lease, and a second proxy's writes get a clear
// error instead of a silent loss.
//
// The lease lives in the upstream, in <db>.tsproxy_leases, one document
// per term: {_id: "<coll>#<term>", ns: <coll>, term, owner, expires}.
// Taking the lease inserts the next term (an insert of a taken _id fails
// on every upstream, so two takers cannot both win); only the holder
// updates its own term's expiry. The holder renews when half the lease is
// used, on the write path, so an idle proxy lets its lease lapse and
// another may take over. A holder counts its lease valid for ttl − ttl/6
// from the start of the renewal, and a taker waits until ttl/6 past the
// stored expiry: clocks of proxies must agree within ttl/6 (5 s by
// default). A write that starts with at least half the lease left is
// assumed to end before the lease can be taken.
//
// A proxy's identity is its host and listen address: two live processes
// cannot listen on both, so a proxy restarted after a crash on the same
// address takes its lease back at once instead of waiting for it to lapse.
//
// It talks to the upstream through the Commander it is given, with the
// privileges of whoever's connection that is, and must not know of rules'
// bucket collections: a lease is named by its database and collection.
package lease
