package updates

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/deletes"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// The update journal (rules.Rule.UpdateJournalCollection) makes an
// update exactly-once across a proxy killed part way, a restart and a
// retry through another proxy. A round of writes that cannot be one
// upstream write of one document (moved events: new buckets, then the
// buckets they left), and every round of a retryable update, is written
// to the journal first as one document, pending, with every bucket it
// will write; then the writes run; then the record is marked done. The
// last round's record of a retryable update keeps the command's reply.
//
// An update begins by reading the journal's pending records (a proxy
// stopped part way left them) and those of its own retry key. A pending
// record is finished under its keys' locks: each new bucket inserted
// unless it is there, each bucket it replaces edited by event identity
// (the events the round updated take their new versions, or go where
// they moved; events a merge added since stay); a new bucket whose _id
// a merge took meanwhile goes to its key's next free seq. Then a
// retry whose reply is recorded is answered with it; otherwise the
// events of its done rounds are left out of its statements' matches, so
// nothing is updated twice.

// Journal fields.
const (
	jCmd      = "c"
	jStmt     = "s"
	jState    = "st"
	jAt       = "at"
	jBuckets  = "b"
	jNew      = "nb"
	jMatched  = "n"
	jModified = "m"
	jIDs      = "ids"
	jUpserted = "up"
	jReply    = "reply"
	// Of each replaced bucket: its _id and its replacement.
	jBucketID  = "i"
	jBucketDoc = "d"
	statePend  = "p"
	stateDone  = "d"
)

// journalRetention is how long done records are kept: a driver retries
// within seconds, and MongoDB keeps a session's record while the session
// lives (30 minutes idle by default).
const journalRetention = 30 * time.Minute

// maxRecordBytes bounds one record's buckets, under the 16 MiB document
// limit with room for the rest.
const maxRecordBytes = 12 << 20

// journal is what an update learned of the journal when it began.
type journal struct {
	// reply is the reply an earlier attempt of the same retryable
	// update recorded: the answer.
	reply bsoncore.Document
	// done are the rounds earlier attempts finished, by statement.
	done map[int]*doneStatement
	// rounds counts this attempt's rounds (records are named by them).
	rounds int
	// attempt tells this attempt's records from earlier attempts'.
	attempt string
}

// doneStatement is what earlier attempts did of one statement.
type doneStatement struct {
	matched, modified int
	ids               map[string]bool // matched event _ids, as value bytes
	upserted          bsoncore.Value
}

// JournalKey names a retryable write in the update journal (Env.RetryKey):
// a digest of its session and owner, which the journal need not hold,
// and its txnNumber.
func JournalKey(k rewrite.RetryKey) string {
	sum := sha256.Sum256([]byte(k.Session))
	return hex.EncodeToString(sum[:12]) + "-" + strconv.FormatInt(k.TxnNumber, 10)
}

func (u *updater) journalColl() string { return u.rule().UpdateJournalCollection() }

// journals says whether every round of this update is journaled (it is
// retryable).
func (u *updater) journals() bool { return u.env.RetryKey != "" }

// openJournal finishes the records earlier attempts left pending and
// reads what the journal holds of this update.
func (u *updater) openJournal() error {
	u.jr = &journal{done: map[int]*doneStatement{}, attempt: u.env.NewObjectID().Hex()}
	if u.env.Sweep {
		if err := u.journalWrite(u.deleteCommand(bsoncore.NewDocumentBuilder().AppendString(jState, stateDone).
			AppendDocument(jAt, bsoncore.NewDocumentBuilder().AppendDateTime("$lt", u.now.Add(-journalRetention).UnixMilli()).Build()).Build())); err != nil {
			return err
		}
	}
	or := bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().AppendString(jState, statePend).Build())
	if u.journals() {
		or.AppendDocument(bsoncore.NewDocumentBuilder().AppendString(jCmd, u.env.RetryKey).Build())
	}
	find := bsoncore.NewDocumentBuilder().AppendString("find", u.journalColl()).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendArray("$or", or.Build()).Build()).
		AppendInt32("batchSize", 1000).AppendBoolean("singleBatch", true).
		AppendString("$db", u.rule().DB).Build()
	reply, ok := u.x.One(find)
	if !ok {
		return rewrite.ErrAborted
	}
	docs, _, err := cursor.Docs(reply)
	if err != nil {
		if mongoerr.CodeOf(err) == mongoerr.NamespaceNotFound {
			return nil
		}
		return fmt.Errorf("tsproxy rule %s: reading the update journal: %w", u.rule().Namespace, err)
	}
	for _, rec := range docs {
		rec = bsoncore.Document(append([]byte(nil), rec...))
		if st, _ := rec.Lookup(jState).StringValueOK(); st == statePend {
			if err := u.finishRecord(rec); err != nil {
				return err
			}
		}
		if c, _ := rec.Lookup(jCmd).StringValueOK(); c == u.env.RetryKey && u.journals() {
			u.jr.learn(rec)
		}
	}
	return nil
}

// learn takes what a record of an earlier attempt of this update says.
func (j *journal) learn(rec bsoncore.Document) {
	if r, ok := rec.Lookup(jReply).DocumentOK(); ok {
		j.reply = r
		return
	}
	s, ok := rec.Lookup(jStmt).AsInt64OK()
	if !ok {
		return
	}
	d := j.done[int(s)]
	if d == nil {
		d = &doneStatement{ids: map[string]bool{}}
		j.done[int(s)] = d
	}
	n, _ := rec.Lookup(jMatched).AsInt64OK()
	m, _ := rec.Lookup(jModified).AsInt64OK()
	d.matched += int(n)
	d.modified += int(m)
	if up := rec.Lookup(jUpserted); up.Type != 0 {
		d.upserted = up
	}
	ids, _ := rec.Lookup(jIDs).ArrayOK()
	vals, _ := ids.Values()
	for _, v := range vals {
		d.ids[idKey(v)] = true
	}
}

// idKey names an event _id by its BSON type and bytes.
func idKey(v bsoncore.Value) string { return string(byte(v.Type)) + string(v.Data) }

// round is one journaled round's writes.
type round struct {
	news     []bsoncore.Document
	replaces []replaced
	matched  int
	modified int
	ids      []bsoncore.Value
	upserted bsoncore.Value
}

// replaced is one bucket a round replaces.
type replaced struct {
	id  bson.ObjectID
	doc bsoncore.Document // without _id
}

// beginRound writes the pending record of a round, when it needs one,
// and returns its _id ("" when not journaled).
func (u *updater) beginRound(st *Statement, r round) (string, error) {
	if !u.journals() && len(r.news) == 0 {
		return "", nil
	}
	key := u.env.RetryKey
	if key == "" {
		key = "-"
	}
	id := key + "." + u.jr.attempt + "." + strconv.Itoa(st.Index) + "." + strconv.Itoa(u.jr.rounds)
	u.jr.rounds++
	rec := bsoncore.NewDocumentBuilder().AppendString("_id", id).
		AppendString(jCmd, u.env.RetryKey).AppendInt32(jStmt, int32(st.Index)).
		AppendString(jState, statePend).AppendDateTime(jAt, u.now.UnixMilli()).
		AppendInt32(jMatched, int32(r.matched)).AppendInt32(jModified, int32(r.modified))
	b := bsoncore.NewArrayBuilder()
	for _, rp := range r.replaces {
		b.AppendDocument(bsoncore.NewDocumentBuilder().AppendObjectID(jBucketID, rp.id).
			AppendDocument(jBucketDoc, rp.doc).Build())
	}
	rec.AppendArray(jBuckets, b.Build())
	nb := bsoncore.NewArrayBuilder()
	for _, d := range r.news {
		nb.AppendDocument(d)
	}
	rec.AppendArray(jNew, nb.Build())
	ids := bsoncore.NewArrayBuilder()
	for _, v := range r.ids {
		ids.AppendValue(v)
	}
	rec.AppendArray(jIDs, ids.Build())
	if r.upserted.Type != 0 {
		rec.AppendValue(jUpserted, r.upserted)
	}
	ins := bsoncore.NewDocumentBuilder().AppendString("insert", u.journalColl()).
		AppendArray("documents", bsoncore.NewArrayBuilder().AppendDocument(rec.Build()).Build()).
		AppendString("$db", u.rule().DB).Build()
	if err := u.journalWrite(ins); err != nil {
		return "", err
	}
	return id, nil
}

// endRound marks a round's record done, under the round's locks: a
// record left pending once its locks are released could be finished by
// a later update after another update changed the same events, and put
// them back. For an update that cannot be retried the record is
// deleted instead (it was only there in case the proxy stopped).
func (u *updater) endRound(id string) error {
	if id == "" {
		return nil
	}
	filter := bsoncore.NewDocumentBuilder().AppendString("_id", id).Build()
	if !u.journals() {
		return u.journalWrite(u.deleteCommand(filter))
	}
	return u.journalWrite(u.markDone(filter))
}

// recordReply keeps a retryable update's reply in the journal, for a
// retry that reaches a proxy which did not run it.
func (u *updater) recordReply(reply bsoncore.Document) error {
	if !u.journals() {
		return nil
	}
	rec := bsoncore.NewDocumentBuilder().AppendString("_id", u.env.RetryKey+".reply").
		AppendString(jCmd, u.env.RetryKey).AppendString(jState, stateDone).
		AppendDateTime(jAt, u.now.UnixMilli()).AppendDocument(jReply, reply).Build()
	up := bsoncore.NewDocumentBuilder().AppendString("update", u.journalColl()).
		AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
			AppendDocument("q", bsoncore.NewDocumentBuilder().AppendString("_id", u.env.RetryKey+".reply").Build()).
			AppendDocument("u", rec).AppendBoolean("upsert", true).Build()).Build()).
		AppendString("$db", u.rule().DB).Build()
	return u.journalWrite(up)
}

// markDone is the update that marks the records filter selects done,
// without their buckets.
func (u *updater) markDone(filter bsoncore.Document) []byte {
	upd := bsoncore.NewDocumentBuilder().
		AppendDocument("$set", bsoncore.NewDocumentBuilder().AppendString(jState, stateDone).Build()).
		AppendDocument("$unset", bsoncore.NewDocumentBuilder().AppendString(jBuckets, "").AppendString(jNew, "").Build()).Build()
	return bsoncore.NewDocumentBuilder().AppendString("update", u.journalColl()).
		AppendArray("updates", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
			AppendDocument("q", filter).AppendDocument("u", upd).Build()).Build()).
		AppendString("$db", u.rule().DB).Build()
}

func (u *updater) deleteCommand(filter bsoncore.Document) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("delete", u.journalColl()).
		AppendArray("deletes", bsoncore.NewArrayBuilder().AppendDocument(bsoncore.NewDocumentBuilder().
			AppendDocument("q", filter).AppendInt32("limit", 0).Build()).Build()).
		AppendString("$db", u.rule().DB).Build()
}

// journalWrite sends a write of the journal and reads its outcome.
func (u *updater) journalWrite(cmd []byte) error {
	reply, ok := u.x.One(cmd)
	if !ok {
		return rewrite.ErrAborted
	}
	if err := mongoerr.ReplyError(reply); err != nil {
		return fmt.Errorf("tsproxy rule %s: the update journal: %w", u.rule().Namespace, err)
	}
	if we, ok := bsoncore.Document(reply).Lookup("writeErrors").ArrayOK(); ok {
		vals, _ := we.Values()
		if len(vals) > 0 {
			d, _ := vals[0].DocumentOK()
			return fmt.Errorf("tsproxy rule %s: the update journal: %w", u.rule().Namespace, mongoerr.FromReply(d, "write error"))
		}
	}
	return nil
}

// finishRecord does what a pending record says was to be done, where it
// was not done yet, and marks it done. It locks the record's keys first. A replaced
// bucket is edited by event identity, not replaced by the record's copy:
// a merge may have topped it up since, and its events are kept.
func (u *updater) finishRecord(rec bsoncore.Document) error {
	id, _ := rec.Lookup("_id").StringValueOK()
	filter := bsoncore.NewDocumentBuilder().AppendString("_id", id).Build()
	news := recordDocs(rec, jNew)
	var replacedDocs []bsoncore.Document
	for _, d := range recordDocs(rec, jBuckets) {
		replacedDocs = append(replacedDocs, d)
	}
	keys := map[string]bucket.Key{}
	for _, d := range news {
		if k, err := keyOf(d); err == nil {
			keys[k.String()] = k
		}
	}
	for _, d := range replacedDocs {
		if doc, ok := d.Lookup(jBucketDoc).DocumentOK(); ok {
			if k, err := keyOf(doc); err == nil {
				keys[k.String()] = k
			}
		}
	}
	unlock := u.env.Lock(keyList(keys))
	defer unlock()
	// Read under the locks: an update still running when the journal
	// was read may have finished it since, and later updates changed its
	// events; finishing it again would put them back.
	if pending, err := u.stillPending(filter); err != nil || !pending {
		return err
	}
	updated := map[string]bool{}
	ids, _ := rec.Lookup(jIDs).ArrayOK()
	vals, _ := ids.Values()
	for _, v := range vals {
		updated[idKey(v)] = true
	}
	for _, doc := range news {
		if err := u.ensureBucket(doc); err != nil {
			return err
		}
	}
	for _, d := range replacedDocs {
		if err := u.reapply(d, updated); err != nil {
			return err
		}
	}
	return u.journalWrite(u.markDone(filter))
}

// stillPending reads whether the record filter selects is pending.
func (u *updater) stillPending(filter bsoncore.Document) (bool, error) {
	find := bsoncore.NewDocumentBuilder().AppendString("find", u.journalColl()).
		AppendDocument("filter", filter).AppendInt32("limit", 1).AppendBoolean("singleBatch", true).
		AppendDocument("projection", bsoncore.NewDocumentBuilder().AppendInt32(jState, 1).Build()).
		AppendString("$db", u.rule().DB).Build()
	reply, ok := u.x.One(find)
	if !ok {
		return false, rewrite.ErrAborted
	}
	docs, _, err := cursor.Docs(reply)
	if err != nil || len(docs) == 0 {
		return false, err
	}
	st, _ := docs[0].Lookup(jState).StringValueOK()
	return st == statePend, nil
}

// recordDocs are the documents of a record's array field.
func recordDocs(rec bsoncore.Document, field string) []bsoncore.Document {
	arr, _ := rec.Lookup(field).ArrayOK()
	vals, _ := arr.Values()
	var out []bsoncore.Document
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			out = append(out, d)
		}
	}
	return out
}

// ensureBucket inserts a new bucket of a pending record unless it is
// there already (a bucket of that _id holding its events); where another
// bucket took its _id since (a merge wrote that seq), its events go to
// the key's next free seq instead.
func (u *updater) ensureBucket(doc bsoncore.Document) error {
	bid, _ := doc.Lookup(bucket.FieldID).ObjectIDOK()
	docs, err := u.req.find.ReadBuckets(u.x, []bson.ObjectID{bid}, true)
	if err != nil {
		return err
	}
	if docs[0] != nil {
		if holdsEvents(docs[0], doc) {
			return nil
		}
		key, err := keyOf(doc)
		if err != nil {
			return err
		}
		seq, err := u.freeSeq(key)
		if err != nil {
			return err
		}
		doc = bsonutil.ReplaceField(doc, bucket.FieldID, func(dst []byte) []byte {
			return bsoncore.AppendObjectIDElement(dst, bucket.FieldID, key.ID(u.rule().BucketNamespace(), seq))
		})
	}
	return u.insertBuckets([]bsoncore.Document{doc})
}

// holdsEvents says whether bucket b holds every event of bucket want (by
// _id).
func holdsEvents(b, want bsoncore.Document) bool {
	have, err := bucket.EventDocs(b)
	if err != nil {
		return false
	}
	ids := map[string]bool{}
	for _, ev := range have {
		ids[idKey(ev.Lookup("_id"))] = true
	}
	evs, err := bucket.EventDocs(want)
	if err != nil {
		return false
	}
	for _, ev := range evs {
		if !ids[idKey(ev.Lookup("_id"))] {
			return false
		}
	}
	return true
}

// reapply makes a bucket of a pending record what the record's update
// made of it: each event whose _id the round updated is its version in
// the record's replacement, or gone where the replacement holds none
// (moved); every other event stays, those a merge added since among
// them. Done already, it writes nothing.
func (u *updater) reapply(d bsoncore.Document, updated map[string]bool) error {
	bid, _ := d.Lookup(jBucketID).ObjectIDOK()
	want, _ := d.Lookup(jBucketDoc).DocumentOK()
	docs, err := u.req.find.ReadBuckets(u.x, []bson.ObjectID{bid}, true)
	if err != nil || docs[0] == nil {
		return err
	}
	meta, start, err := bucket.KeyFields(docs[0])
	if err != nil {
		return err
	}
	wantEvents, err := bucket.EventDocs(want)
	if err != nil {
		return err
	}
	versions := map[string]bsoncore.Document{}
	for _, ev := range wantEvents {
		versions[idKey(ev.Lookup("_id"))] = ev
	}
	current, err := bucket.EventDocs(docs[0])
	if err != nil {
		return err
	}
	var keep []bucket.Event
	changed := false
	for _, ev := range current {
		k := idKey(ev.Lookup("_id"))
		if !updated[k] {
			keep = append(keep, u.req.find.StoredToEvent(ev, meta, start))
			continue
		}
		v, ok := versions[k]
		if !ok {
			changed = true // moved out
			continue
		}
		changed = changed || string(v) != string(ev)
		keep = append(keep, u.req.find.StoredToEvent(v, meta, start))
	}
	if !changed {
		return nil
	}
	doc := bucket.Shell(meta, start)
	if len(keep) > 0 {
		doc = deletes.WithoutID(bucket.Complete(bid, keep, u.rule(), u.req.find.Limits()))
	}
	_, err = u.req.find.Write(u.x, u.env.Env, u.req.find.ReplaceCommand([]deletes.BucketEdit{{ID: bid, Replacement: doc}}), 1)
	return err
}
