package merge

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/stage"
)

// planDoc is a merge plan as stored in its retired collection:
// {_id: "plan", packedBases: [{k: <key>, s: <seq>}...], packedSkip:
// <ids, 12 bytes each>, packedIDs: <staged _ids, each a varint length
// then its type byte and bytes>}. The staged ids are packed into one binary value
// because FerretDB stores a document as JSON value by value: a plan of
// 1,000 staged documents as an array took 6 ms to insert on FerretDB over
// PostgreSQL, packed 2 ms, and every merge writes one before its buckets.
// The bases go under a name proxies older than packing do not read (as
// "topUpBases" did before, for topping up): such a proxy finds no bases
// and stops, rather than take the merge for one of no documents.
func planDoc(p *mergePlan) bsoncore.Document {
	bases := bsoncore.NewArrayBuilder()
	for k, s := range p.bases {
		bases.AppendDocument(bsoncore.NewDocumentBuilder().AppendBinary("k", 0, []byte(k)).AppendInt32("s", int32(s)).Build())
	}
	skip := make([]byte, 0, len(p.skip)*len(bson.ObjectID{}))
	for id := range p.skip {
		skip = append(skip, id[:]...)
	}
	ids := make([]byte, 0, len(p.ids)*14)
	for k := range p.ids {
		// A key is an _id's type byte and value: at most 1+16 MiB in
		// principle, so its length is a varint.
		ids = binary.AppendUvarint(ids, uint64(len(k)))
		ids = append(ids, k...)
	}
	// A plan with top-ups keeps its bases under a name of its own, as
	// before packing (when "topUpBases" stopped proxies older than
	// topping up, which would write the topped-up events again).
	basesField := planBases
	if len(p.tops) > 0 {
		basesField = planTopUpBases
	}
	b := bsoncore.NewDocumentBuilder().AppendString("_id", planID).
		AppendArray(basesField, bases.Build()).AppendBinary(planSkip, 0, skip).AppendBinary(planIDs, 0, ids)
	if len(p.tops) > 0 {
		b.AppendArray("tops", topUpsDoc(p.tops))
	}
	if p.mark != "" {
		b.AppendString("mark", p.mark)
	}
	if p.record != "" {
		b.AppendString("record", p.record)
	}
	return b.Build()
}

// The fields of a plan document (planDoc). Plans of proxies before
// packing have "bases" or "topUpBases", "skip" and "ids" as arrays.
const (
	planBases      = "packedBases"
	planTopUpBases = "packedTopUpBases"
	planSkip       = "packedSkip"
	planIDs        = "packedIDs"
)

// readPlan reads planDoc's output back, and the plans of proxies before
// packing.
func readPlan(d bsoncore.Document) (*mergePlan, error) {
	p := &mergePlan{bases: map[string]int{}, skip: map[bson.ObjectID]bool{}, ids: map[string]bool{}}
	bad := func(what string) (*mergePlan, error) { return nil, fmt.Errorf("plan document: %s", what) }
	var bases bsoncore.Array
	found := false
	for _, f := range []string{planBases, planTopUpBases, "bases", "topUpBases"} {
		if bases, found = d.Lookup(f).ArrayOK(); found {
			break
		}
	}
	if !found {
		return bad("no bases")
	}
	vals, err := bases.Values()
	if err != nil {
		return bad(err.Error())
	}
	for _, v := range vals {
		e, ok := v.DocumentOK()
		if !ok {
			return bad("a base is not a document")
		}
		_, k, okK := e.Lookup("k").BinaryOK()
		s, okS := e.Lookup("s").AsInt64OK()
		if !okK || !okS {
			return bad("a base lacks k or s")
		}
		if s < 0 || s > bucket.MaxSeq {
			// No merge writes such a seq (seqs stay under bucket.MaxSeq,
			// and planDoc stores them as int32): the document is damaged,
			// and buckets placed by it would land on wrong ids.
			return bad(fmt.Sprintf("a base's seq %d is out of range", s))
		}
		p.bases[string(k)] = int(s)
	}
	if err := readPlanIDs(d, p); err != nil {
		return bad(err.Error())
	}
	if tops, ok := d.Lookup("tops").ArrayOK(); ok {
		p.rawTops = tops
	}
	p.mark, _ = d.Lookup("mark").StringValueOK()
	p.record, _ = d.Lookup("record").StringValueOK()
	if err := readPlanSkip(d, p); err != nil {
		return bad(err.Error())
	}
	return p, nil
}

// readPlanIDs reads the staged ids of plan document d into p.ids.
func readPlanIDs(d bsoncore.Document, p *mergePlan) error {
	if _, packed, ok := d.Lookup(planIDs).BinaryOK(); ok {
		for len(packed) > 0 {
			n, w := binary.Uvarint(packed)
			if w <= 0 || n > uint64(len(packed)-w) {
				return fmt.Errorf("%s is cut short", planIDs)
			}
			p.ids[string(packed[w:w+int(n)])] = true
			packed = packed[w+int(n):]
		}
		return nil
	}
	ids, ok := d.Lookup("ids").ArrayOK()
	if !ok {
		return nil
	}
	vals, err := ids.Values()
	if err != nil {
		return err
	}
	for _, v := range vals {
		if _, k, ok := v.BinaryOK(); ok {
			p.ids[string(k)] = true
		}
	}
	return nil
}

// readPlanSkip reads the retries plan document d skips into p.skip.
func readPlanSkip(d bsoncore.Document, p *mergePlan) error {
	if _, packed, ok := d.Lookup(planSkip).BinaryOK(); ok {
		if len(packed)%len(bson.ObjectID{}) != 0 {
			return fmt.Errorf("%s is not a whole number of ids", planSkip)
		}
		for ; len(packed) > 0; packed = packed[len(bson.ObjectID{}):] {
			p.skip[bson.ObjectID(packed[:len(bson.ObjectID{})])] = true
		}
		return nil
	}
	skip, ok := d.Lookup("skip").ArrayOK()
	if !ok {
		return nil
	}
	ids, err := skip.Values()
	if err != nil {
		return err
	}
	for _, v := range ids {
		if id, ok := v.ObjectIDOK(); ok {
			p.skip[id] = true
		}
	}
	return nil
}

// recordKey names the merge of retired collection r by plan in its
// record: the key its plan holds, made when the plan was (newMergePlan),
// or, for a plan of a proxy before merge keys, r's token as that proxy
// named it. A token alone did not name one merge: two proxies' clocks, or
// one proxy's pass after another's, can give two retired collections the
// same token, and a merge took the other's record for its own and merged
// the retries it held a second time.
func recordKey(r stage.Collection, plan *mergePlan) string {
	if plan.record != "" {
		return plan.record
	}
	return strconv.FormatInt(r.Token, 10)
}

// records are the records of merged retryable writes for this merge:
// those the proxy keeps (MergeOptions.Records), else read back
// (loadRecords). It notes whether older records are there to expire
// (expireRecords).
func (m *Merge) records(x *rewrite.Exec) (*stage.RecordSet, error) {
	cut := m.opts.Now.Add(-m.opts.RetryHorizon).UnixMilli()
	if m.opts.Records == nil {
		return m.loadRecords(x, cut)
	}
	coll, ok, err := m.collectionID(x, stage.TxnsCollection(m.rule))
	if err != nil {
		return nil, err
	}
	if ok {
		if set := m.opts.Records.Get(coll); set != nil {
			m.expired = set.HasBefore(cut)
			return set, nil
		}
	}
	set, err := m.loadRecords(x, cut)
	if err == nil && ok {
		m.opts.Records.Put(coll, set)
	}
	return set, err
}

// loadRecords reads the derived ids merged since cut (ms), and notes
// whether older records are there to expire (expireRecords).
func (m *Merge) loadRecords(x *rewrite.Exec, cut int64) (*stage.RecordSet, error) {
	coll := stage.TxnsCollection(m.rule)
	docs, err := drainAll(x, m.rule.DB, coll, stage.FindCommand(m.rule.DB, coll, nil, nil), 0)
	if err != nil {
		return nil, err
	}
	m.Stats.RecordReads++
	set := stage.NewRecordSet()
	for _, d := range docs {
		at, ok := d.Lookup("at").DateTimeOK()
		if !ok || at < cut {
			m.expired = true
			continue
		}
		set.Add(stage.RecordKeyOf(d), at, stage.RecordIDs(d))
	}
	return set, nil
}

// horizonFilter is {at: {op: now - RetryHorizon}}.
func (m *Merge) horizonFilter(op string) bsoncore.Document {
	cut := m.opts.Now.Add(-m.opts.RetryHorizon).UnixMilli()
	return bsoncore.NewDocumentBuilder().AppendDocument("at", bsoncore.NewDocumentBuilder().AppendDateTime(op, cut).Build()).Build()
}

// expireRecords deletes the records older than the retry horizon, when
// records found any, and forgets them in set.
func (m *Merge) expireRecords(x *rewrite.Exec, set *stage.RecordSet) error {
	if !m.expired {
		return nil
	}
	if err := m.deleteMany(x, stage.TxnsCollection(m.rule), m.horizonFilter("$lt")); err != nil {
		return fmt.Errorf("merge %s: expire records: %w", m.rule.Namespace, err)
	}
	set.DropBefore(m.opts.Now.Add(-m.opts.RetryHorizon).UnixMilli())
	m.expired = false
	return nil
}
