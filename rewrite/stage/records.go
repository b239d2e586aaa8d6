package stage

import (
	"bytes"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// RecordDoc is the record of the ids one merge of a retired collection
// merged (recordedID), under that merge's key (recordKey): {_id: key,
// packed: <the ids' 12 bytes each, as one binary>, at: now}. A key of
// digits alone is a token, as proxies before merge keys recorded, and is
// stored as one. Packed because FerretDB stores a document as JSON value
// by value: records of 4,000 ids as an array took 29 ms to read back at
// each merge on the embedded upstream, and their expiry as long to delete.
func RecordDoc(key string, ids []bson.ObjectID, now time.Time) bsoncore.Document {
	packed := make([]byte, 0, len(ids)*len(bson.ObjectID{}))
	for _, id := range ids {
		packed = append(packed, id[:]...)
	}
	b := bsoncore.NewDocumentBuilder()
	if token, err := strconv.ParseInt(key, 10, 64); err == nil {
		b.AppendInt64("_id", token)
	} else {
		b.AppendString("_id", key)
	}
	return b.AppendBinary("packed", 0, packed).AppendDateTime("at", now.UnixMilli()).Build()
}

// NewRecordKey is a new merge's record key: its collection's name and a
// random part, since a retired collection's name may come back.
func NewRecordKey(r Collection) string {
	return r.Name + "/" + bson.NewObjectID().Hex()
}

// RecordKeyOf is the key of record document d.
func RecordKeyOf(d bsoncore.Document) string {
	v := d.Lookup("_id")
	if s, ok := v.StringValueOK(); ok {
		return s
	}
	token, _ := v.AsInt64OK()
	return strconv.FormatInt(token, 10)
}

// RecordIDs are the derived ids of a record: packed, or an array (the
// records of proxies before packing).
func RecordIDs(d bsoncore.Document) []bson.ObjectID {
	var out []bson.ObjectID
	if _, packed, ok := d.Lookup("packed").BinaryOK(); ok {
		for len(packed) >= len(bson.ObjectID{}) {
			out = append(out, bson.ObjectID(packed[:len(bson.ObjectID{})]))
			packed = packed[len(bson.ObjectID{}):]
		}
	}
	arr, _ := d.Lookup("ids").ArrayOK()
	vals, _ := arr.Values()
	for _, v := range vals {
		if id, ok := v.ObjectIDOK(); ok {
			out = append(out, id)
		}
	}
	return out
}

// RecordSet is the records of merged retryable writes within the retry
// horizon (TxnsCollection): the ids each merge (by its record key)
// merged, sorted, 12 bytes an id (a Go map took 47), and when it recorded
// them.
type RecordSet struct {
	runs []recordRun
	// n is the number of ids: read by the proxy's bound across rules
	// (Len) while the rule's merge changes the set.
	n atomic.Int64
}

type recordRun struct {
	key string
	at  int64 // ms
	ids []bson.ObjectID
}

// NewRecordSet is an empty RecordSet.
func NewRecordSet() *RecordSet { return &RecordSet{} }

// Len is the number of derived ids recorded.
func (s *RecordSet) Len() int { return int(s.n.Load()) }

// Add records ids as merged by the merge of key at at (ms). A key
// recorded already (a repeated merge's) keeps its time and takes the ids
// too.
func (s *RecordSet) Add(key string, at int64, ids []bson.ObjectID) {
	i := slices.IndexFunc(s.runs, func(r recordRun) bool { return r.key == key })
	if i < 0 {
		s.runs = append(s.runs, recordRun{key: key, at: at})
		i = len(s.runs) - 1
	}
	r := &s.runs[i]
	before := len(r.ids)
	r.ids = append(r.ids, ids...)
	slices.SortFunc(r.ids, compareIDs)
	r.ids = slices.Compact(r.ids)
	s.n.Add(int64(len(r.ids) - before))
}

// MergedElsewhere are those of ids (recordedIDs of staged documents)
// that a merge other than key's recorded: retries of writes merged
// before, and copies of documents moved back to staging. One pass over
// each merge's sorted ids.
func (s *RecordSet) MergedElsewhere(ids []bson.ObjectID, key string) map[bson.ObjectID]bool {
	if len(ids) == 0 || s.Len() == 0 {
		return nil
	}
	want := slices.SortedFunc(slices.Values(ids), compareIDs)
	out := map[bson.ObjectID]bool{}
	for _, r := range s.runs {
		if r.key == key {
			continue
		}
		for i, j := 0, 0; i < len(want) && j < len(r.ids); {
			switch c := compareIDs(want[i], r.ids[j]); {
			case c < 0:
				i++
			case c > 0:
				j++
			default:
				out[want[i]] = true
				i++
				j++
			}
		}
	}
	return out
}

func compareIDs(a, b bson.ObjectID) int { return bytes.Compare(a[:], b[:]) }

// HasBefore says whether a record is older than cut (ms).
func (s *RecordSet) HasBefore(cut int64) bool {
	return slices.ContainsFunc(s.runs, func(r recordRun) bool { return r.at < cut })
}

// DropBefore forgets the records older than cut (ms), deleted upstream.
func (s *RecordSet) DropBefore(cut int64) {
	s.runs = slices.DeleteFunc(s.runs, func(r recordRun) bool {
		if r.at < cut {
			s.n.Add(-int64(len(r.ids)))
			return true
		}
		return false
	})
}

// RecordCache keeps the records of merged retryable writes between the
// merges of the proxy that holds the rule's writer lease: merges are
// their only writers while it holds its term, so it reads them once a
// term (and again when their collection is another), where every merge
// read them all. They hold every derived id merged within the retry
// horizon: after 10 minutes of 2,000 retryable inserts a second, 1.2
// million ids, 14 MB read back and put in a map at every merge.
type RecordCache struct {
	// Get returns the records the proxy keeps for the records collection
	// of uuid coll, nil when it keeps none that still hold.
	Get func(coll string) *RecordSet
	// Put keeps s, read from the records collection of uuid coll (the
	// merge goes on updating s as it records and expires).
	Put func(coll string, s *RecordSet)
}
