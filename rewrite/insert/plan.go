package insert

import (
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
)

// Fills is the proxy's memory of the open bucket of each (series, window)
// key an insert writes. The proxy holds the keys' locks while the plan
// runs, so the fills are the plan's to read and set.
type Fills interface {
	Fill(k bucket.Key) bucket.Fill
	Set(k bucket.Key, f bucket.Fill)
}

// Env is what an insert plan needs besides the command.
type Env struct {
	Caps        caps.Upstream
	NewObjectID func() bson.ObjectID
	Fills       Fills
	// Check are the keys whose buckets may hold events of a retry of this
	// very write that the proxy did not see through (see the proxy's
	// reply cache): they are read first, and the events found there are
	// not written again.
	Check []bucket.Key
	// StmtIDs: see Options.StmtIDs.
	StmtIDs []int
}

// maxProbeSeq bounds the point reads that look for a key's open bucket.
const maxProbeSeq = 1 << 16

// Plan stores a prepared insert's events as buckets: it loads the fills
// it does not know by point reads on the deterministic bucket ids, leaves
// out the events a retry finds stored, runs the bucket writes (an update
// marked so, for the proxy's write slots), and re-plans the statements
// that met a duplicate key (a full bucket, or a seq another writer took),
// keeping the new fills.
func Plan(cmd rewrite.Command, pi *Prepared, env Env) rewrite.Plan {
	p := &plan{cmd: cmd, pi: pi, env: env, rule: pi.rule}
	if len(env.Check) > 0 && MayBeUnseenRetry(cmd, env.Caps) {
		p.load = newFillLoader(pi.rule, env.Fills, env.Check)
		p.phase = phaseCheckFills
	} else {
		p.startFills()
	}
	return p
}

type phase int

const (
	phaseCheckFills phase = iota // loading the fills of the keys to check
	phaseCheckRead               // reading their buckets' events
	phaseFills                   // loading the fills to plan against
	phaseWrite                   // running the bucket writes
	phaseDone
)

type plan struct {
	cmd  rewrite.Command
	pi   *Prepared
	env  Env
	rule *rules.Rule

	phase   phase
	load    *fillLoader
	reads   []bson.ObjectID // phaseCheckRead: buckets to read
	stored  map[string]bool // identities of the events found stored
	replay  *ReplayFilter   // the events a retry leaves to write
	ins     *Commands       // phaseWrite
	next    int             // the command of ins to send next
	replies [][]byte        // of ins's commands so far
	// retrying holds the replies of a round that met duplicate keys,
	// while the fills its re-plan needs are loaded.
	retrying [][]byte
	rereads  int // read steps sent again, their collection dropped under them
	res      rewrite.Result
}

// maxRereads bounds how many times a plan sends a read step again whose
// collection was dropped under it (a retention sweeper dropping a
// partition, on FerretDB over PostgreSQL): one is enough once the drop
// has ended, but a sweeper may drop the next partition meanwhile.
const maxRereads = 3

func (p *plan) Next() (rewrite.Step, bool) {
	switch p.phase {
	case phaseCheckFills, phaseFills:
		if step := p.load.step(); step != nil {
			return step, false
		}
		p.loaded()
		return p.Next()
	case phaseCheckRead:
		step := make(rewrite.Step, len(p.reads))
		for i, id := range p.reads {
			step[i] = rewrite.Upstream{Body: storedEventsCommand(p.rule, id)}
		}
		return step, false
	case phaseWrite:
		body, ident, stmts, err := p.ins.CommandSections(p.next)
		if err != nil {
			p.fail(err)
			return nil, true
		}
		docs := make([]bsoncore.Document, len(stmts))
		for i, s := range stmts {
			docs[i] = s
		}
		return rewrite.Step{{Body: body, Seq: &rewrite.Sequence{Identifier: ident, Documents: docs}, Update: p.ins.IsUpdate(p.next)}}, false
	}
	return nil, true
}

func (p *plan) Feed(replies [][]byte) error {
	if p.phase != phaseWrite && p.droppedUnder(replies) {
		return nil // Next sends the same reads again
	}
	switch p.phase {
	case phaseCheckFills, phaseFills:
		return p.load.feed(replies)
	case phaseCheckRead:
		for i, r := range replies {
			doc, err := cursor.First(r)
			if err != nil {
				return mongoerr.Errorf(mongoerr.FromReply(r, "").Code, "tsproxy rule %s: check for a retried insert: bucket %s: %v", p.rule.Namespace, p.reads[i].Hex(), err)
			}
			if doc != nil {
				StoredEventIdentities(bson.Raw(doc), p.rule, p.stored)
			}
		}
		p.afterCheck()
		return nil
	case phaseWrite:
		p.replies = append(p.replies, replies[0])
		if p.ins.Continue(p.next, replies[0]) {
			p.next++
			return nil
		}
		return p.roundDone()
	}
	return nil
}

func (p *plan) Result() rewrite.Result { return p.res }

// droppedUnder says whether a reply of a read step (the fill probes, the
// check of a retry's buckets) met its collection dropped under it
// (mongoerr.DroppedUnderQuery), while the plan may still read again. It
// is checked before Feed changes anything, so Next sends the step again
// as it was; the read then finds no collection, as after any drop. A
// write is never sent again: it may have stored part of its events.
func (p *plan) droppedUnder(replies [][]byte) bool {
	if p.rereads >= maxRereads {
		return false
	}
	for _, r := range replies {
		if mongoerr.DroppedUnderQueryReply(r) {
			p.rereads++
			return true
		}
	}
	return false
}

// loaded moves on once the fill loader has what it needs.
func (p *plan) loaded() {
	if p.phase == phaseFills && p.retrying != nil {
		replies := p.retrying
		p.retrying = nil
		next := p.ins.RetryFromRaw(replies, p.env.Fills.Fill)
		if next == nil {
			p.finish(rewrite.Result{Reply: p.reply(replies)})
			return
		}
		p.ins = next
		p.write()
		return
	}
	if p.phase == phaseFills {
		p.write()
		return
	}
	// The keys to check: read every bucket of theirs.
	p.stored = map[string]bool{}
	ns := p.rule.BucketNamespace()
	for _, k := range p.env.Check {
		for seq := 0; seq <= p.env.Fills.Fill(k).Seq; seq++ {
			p.reads = append(p.reads, k.ID(ns, seq))
		}
	}
	if len(p.reads) == 0 {
		p.afterCheck()
		return
	}
	p.phase = phaseCheckRead
}

// afterCheck leaves out the events found stored.
func (p *plan) afterCheck() {
	p.replay = WithoutStored(p.cmd, p.rule, p.stored)
	if p.replay == nil {
		p.startFills()
		return
	}
	if p.replay.AllStored() {
		p.finish(rewrite.Result{Reply: p.replay.AllStoredReply()})
		return
	}
	// The events left are a subset of those prepared, so their keys are
	// among the locked ones.
	pi, err := Prepare(p.replay.Command, p.rule, p.env.NewObjectID)
	if err != nil {
		p.fail(err)
		return
	}
	p.pi = pi
	p.startFills()
}

// startFills loads the fills of the insert's keys it does not know.
func (p *plan) startFills() {
	p.load = newFillLoader(p.rule, p.env.Fills, p.pi.Keys())
	p.phase = phaseFills
}

// write plans against the fills and starts the bucket writes.
func (p *plan) write() {
	if p.ins == nil {
		p.ins = p.pi.Plan(Options{Caps: p.env.Caps, NewObjectID: p.env.NewObjectID, Buckets: p.env.Fills.Fill, StmtIDs: p.env.StmtIDs})
	}
	p.next, p.replies = 0, nil
	if len(p.ins.Commands) == 0 {
		p.finish(rewrite.Result{Reply: p.reply(nil)})
		return
	}
	p.phase = phaseWrite
}

// roundDone keeps the fills a round of writes reported; statements that
// met a duplicate key are re-planned once the fills they need are loaded
// again (see loaded).
func (p *plan) roundDone() error {
	for _, f := range p.ins.FillsFromRaw(p.replies) {
		p.env.Fills.Set(f.Key, f.Fill)
	}
	if !p.ins.RetriableRaw(p.replies) {
		p.finish(rewrite.Result{Reply: p.reply(p.replies)})
		return nil
	}
	p.retrying = p.replies
	p.startFills()
	return nil
}

func (p *plan) reply(replies [][]byte) []byte {
	out := p.ins.ReplyFromRaw(replies)
	if p.replay != nil {
		out = p.replay.MapReply(out)
	}
	return out
}

func (p *plan) finish(r rewrite.Result) {
	if p.replay != nil {
		r.StoredBefore = p.replay.Skipped()
	}
	p.res, p.phase = r, phaseDone
}

func (p *plan) fail(err error) {
	p.finish(rewrite.Result{Reply: mongoerr.Reply(err)})
}

// storedEventsCommand reads the meta and events of bucket id.
func storedEventsCommand(rule *rules.Rule, id bson.ObjectID) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("find", rule.BucketCollection).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendObjectID(bucket.FieldID, id).Build()).
		AppendDocument("projection", bsoncore.NewDocumentBuilder().AppendInt32(bucket.FieldMeta, 1).AppendInt32(bucket.FieldEvents, 1).AppendInt32(bucket.FieldPacked, 1).Build()).
		AppendInt32("limit", 1).AppendBoolean("singleBatch", true).AppendString("$db", rule.DB).Build()
}

// fillLoader finds the open bucket of every key whose fill is unknown, by
// point reads on the deterministic bucket ids: seq 0, 1, ... until a miss;
// the last hit is the open bucket. Each read is a find on {_id: X}, which
// every upstream answers from its _id index. The keys being probed are
// read together, one seq at a time.
type fillLoader struct {
	rule  *rules.Rule
	fills Fills
	keys  []bucket.Key // still probing
	found []bucket.Fill
	seq   int
	err   error
}

func newFillLoader(rule *rules.Rule, fills Fills, keys []bucket.Key) *fillLoader {
	l := &fillLoader{rule: rule, fills: fills}
	for _, k := range keys {
		if !fills.Fill(k).Known {
			l.keys = append(l.keys, k)
			l.found = append(l.found, bucket.Fill{Seq: -1, Known: true})
		}
	}
	return l
}

// step is the next reads, or nil when every fill is known.
func (l *fillLoader) step() rewrite.Step {
	if len(l.keys) == 0 {
		return nil
	}
	ns := l.rule.BucketNamespace()
	step := make(rewrite.Step, len(l.keys))
	for i, k := range l.keys {
		step[i] = rewrite.Upstream{Body: probeCommand(l.rule, k.ID(ns, l.seq))}
	}
	return step
}

func (l *fillLoader) feed(replies [][]byte) error {
	keys, found := l.keys[:0], l.found[:0]
	for i, r := range replies {
		doc, err := cursor.First(r)
		if err != nil {
			e := mongoerr.FromReply(r, err.Error())
			return mongoerr.Errorf(e.Code, "tsproxy rule %s: load bucket fill: %s", l.rule.Namespace, e.Msg)
		}
		f := l.found[i]
		if doc == nil {
			l.fills.Set(l.keys[i], f)
			continue
		}
		f.Seq = l.seq
		f.Count = int(rawInt(doc, bucket.FieldCount))
		f.Bytes = rawInt(doc, bucket.FieldBytes)
		keys, found = append(keys, l.keys[i]), append(found, f)
	}
	l.keys, l.found = keys, found
	if l.seq++; l.seq >= maxProbeSeq && len(l.keys) > 0 {
		return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: more than %d buckets for one series and window", l.rule.Namespace, maxProbeSeq)
	}
	return nil
}

// probeCommand reads the count and bytes of bucket id.
func probeCommand(rule *rules.Rule, id bson.ObjectID) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("find", rule.BucketCollection).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendObjectID(bucket.FieldID, id).Build()).
		AppendDocument("projection", bsoncore.NewDocumentBuilder().AppendInt32(bucket.FieldCount, 1).AppendInt32(bucket.FieldBytes, 1).Build()).
		AppendInt32("limit", 1).AppendBoolean("singleBatch", true).AppendString("$db", rule.DB).Build()
}

// rawInt reads a numeric field as an int64 (0 when absent or not a number).
func rawInt(doc bsoncore.Document, key string) int64 {
	n, _ := doc.Lookup(key).AsInt64OK()
	return n
}
