package stage

import (
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
)

// KnownKey is what a key's buckets are known to be.
type KnownKey struct {
	// Next is the key's first free seq: 0 when it has no bucket.
	Next int
	// Last is the key's last bucket (seq Next-1) as the merge wrote it,
	// when it has room for more events; nil when it is full or not kept.
	Last bsoncore.Document
	// Full: the last bucket has no room (nothing to top up).
	Full bool
	// Closed: a merge of this directory's life took events of a later
	// window of the key's series with the key's own, so the key's window
	// has had its one closing top-up.
	Closed bool
}

// Known is the merging proxy's directory of the rule's buckets
// (MergeOptions.Known).
type Known struct {
	// Dir holds the directory.
	Dir Directory
	// NoRead: the directory is only what this proxy's merges learned;
	// keys it lacks are probed, and the buckets' keys are never read
	// (scanDirectory). Where a probe is an indexed lookup (the embedded
	// upstream) it costs the buckets it finds, while the read decodes
	// every bucket of the rule: at each term's first merge, and again
	// after each direct insert, delete or sweep.
	NoRead bool
}

// Directory is what a merge asks of the proxy's directory of a rule's
// buckets. It answers from memory.
type Directory interface {
	// Of returns what is known of keys while the bucket collection is
	// coll (its uuid; "": it does not exist). complete: the directory
	// holds every key of the collection, so a key it lacks has no bucket
	// (Next 0, in known). read: the keys were read this term (a read that
	// could not make it complete is not tried again until the directory
	// starts over).
	Of(coll string, keys []bucket.Key) (known map[string]KnownKey, complete, read bool)
	// Load gives the directory the keys of collection coll
	// (scanDirectory); complete: every one of them.
	Load(coll string, keys map[string]KnownKey, complete bool)
	// Learn records what a merge left in keys of collection coll.
	Learn(coll string, keys map[string]KnownKey)
}

// MaxDirectoryKeys bounds the keys one directory read takes in: past it
// the merge probes as without one (a rule with that many (series,
// window) keys keeps them out of the proxy's memory).
const MaxDirectoryKeys = 100_000

// KnownOf is what dir knows of keys: what it holds of each, and, when it
// is complete (every key of the collection), Next 0 for a key it lacks
// (no bucket).
func KnownOf(dir map[string]KnownKey, complete bool, keys []bucket.Key) map[string]KnownKey {
	out := make(map[string]KnownKey, len(keys))
	for _, k := range keys {
		if kk, ok := dir[k.String()]; ok || complete {
			out[k.String()] = kk
		}
	}
	return out
}

// SweepGrace is how long before the retention cutoff a key's buckets
// are no longer taken from the directory: sweep intervals and clocks.
const SweepGrace = 2 * time.Hour

// ErrTooManyKeys stops scanDirectory's read past MaxDirectoryKeys.
var ErrTooManyKeys = errors.New("more bucket keys than a directory holds")
