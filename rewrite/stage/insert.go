package stage

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// InsertEnv is what a staged insert needs besides the command.
type InsertEnv struct {
	// Identity names the users authenticated on the client's connection
	// (empty for none): a retry is recognised only for the same users.
	Identity string
	// NewObjectID makes the _id of a staged document of a write that is
	// not retryable. Required.
	NewObjectID func() bson.ObjectID
	// Combinable: the upstream keeps no session state (FerretDB), so the
	// staged inserts go without the session's fields and may share an
	// upstream insert with other clients' (rewrite.Upstream.Combine).
	// Never inside a transaction.
	Combinable bool
	// Stager names the staging collections this proxy inserts into (the
	// zero Stager: the writer lease holder's).
	Stager Stager
	// Retry, when set, is RetryKeyOf(the command's body), which the
	// caller read already (the proxy, for its reply cache).
	Retry *rewrite.ReadRetryKey
	// Format is the form of the staged documents (the zero value:
	// bucket.StagedKeyed, which every proxy reads; the rule's staging
	// format record says which one every proxy that may merge it reads).
	Format bucket.StagedFormat
	// Stamp, when set, gives each staged document its arrival stamp
	// (bucket.StagedOptions.At): increasing, in the order the proxy took
	// the inserts. The slots layout's merge applies writes in that order.
	Stamp func() int64
}

// stagedDoc is one staged document and the client's events it carries.
type stagedDoc struct {
	doc    bsoncore.Document
	events []int // indexes in the client's batch
	fixed  bool  // its _id is derived from the write (a retry meets it)
}

// stagedCommand is one insert into one staging collection.
type stagedCommand struct {
	coll string
	docs []stagedDoc
}

// Insert is the plan of a prepared insert on a staged rule: one insert of
// staged documents per staging collection. A duplicate key on a derived _id is the
// write's own earlier attempt: its events count as stored. Each upstream
// insert is unordered, even for an ordered client insert, because an
// ordered one would stop at that duplicate key and leave the rest of a
// retry unwritten; an ordered insert stops after the first command with
// a failure (a failure of a staged document is the upstream's, such as
// a full disk, never the events': they were validated before).
func Insert(cmd rewrite.Command, pi *insert.Prepared, env InsertEnv) rewrite.Plan {
	cmds, err := stagedCommands(cmd, pi, env)
	if err != nil {
		return rewrite.Fail(err)
	}
	args := rewrite.ReadCarriedArgs(cmd.Body)
	inTxn := rewrite.InTransaction(cmd.Body)
	combine := env.Combinable && !inTxn
	switch {
	case combine:
		args = args.WithoutSession()
	case !inTxn:
		// One staged insert may be several upstream inserts (one a
		// staging period): with one txnNumber and no stmtIds, MongoDB
		// took the second's documents for retries of the first's and
		// skipped them, acknowledged. A retry is safe without it: a
		// staged document's _id is derived from the write, and meets
		// its first attempt as a duplicate key.
		args = args.WithoutTxnNumber()
	}
	return &insertPlan{pi: pi, cmds: cmds, args: args, combine: combine, keep: env.Stager.Tag != "",
		out: outcome{errs: slices.Clone(pi.Rejected())}}
}

// insertPlan sends a staged insert's commands one after the other. It is
// a plain state machine, not a rewrite.Script: every per-event insert
// runs it, and a script's coroutine (a goroutine whose stack grows on
// each start) cost more than the rest of the plan.
type insertPlan struct {
	pi            *insert.Prepared
	cmds          []stagedCommand
	args          rewrite.CarriedArgs
	combine, keep bool
	next          int // the command Next sends, then Feed reads
	out           outcome
}

func (p *insertPlan) Next() (rewrite.Step, bool) {
	if p.next >= len(p.cmds) || p.out.stopped(p.pi.Ordered()) {
		return nil, true
	}
	body, seq := insertCommand(p.pi.Rule().DB, p.cmds[p.next], p.args, p.next == 0)
	return rewrite.Step{{Body: body, Seq: seq, Combine: p.combine, Keep: p.keep}}, false
}

func (p *insertPlan) Feed(replies [][]byte) error {
	p.out.read(p.cmds[p.next], replies[0])
	p.next++
	return nil
}

func (p *insertPlan) Result() rewrite.Result {
	return rewrite.Result{Reply: insert.WriteReply(p.out.n, p.out.errs, p.out.wce, bsoncore.Value{}), StoredBefore: p.out.before}
}

// stagedCommands builds the staged documents of the insert's groups,
// cut to the rule's bucket limits, by staging collection in order of
// first appearance.
func stagedCommands(cmd rewrite.Command, pi *insert.Prepared, env InsertEnv) ([]stagedCommand, error) {
	key, retryable, err := retryKeyOf(cmd, env)
	if err != nil {
		return nil, err
	}
	if !retryable && env.NewObjectID == nil {
		return nil, mongoerr.Errorf(mongoerr.InternalError, "stage: InsertEnv.NewObjectID is nil")
	}
	rule, lim := pi.Rule(), pi.Limits()
	var byColl map[string]int // made once an insert spans several staging collections
	var out []stagedCommand
	var chunks [][][]bucket.Event // by staging collection
	for _, g := range pi.Groups() {
		coll := OpenCollection(rule, g[0].Start, env.Stager)
		i, ok := collIndex(out, byColl, coll)
		if !ok {
			i = len(out)
			if len(out) == 1 {
				byColl = map[string]int{out[0].coll: 0}
			}
			if byColl != nil {
				byColl[coll] = i
			}
			out = append(out, stagedCommand{coll: coll})
			chunks = append(chunks, nil)
		}
		chunks[i] = append(chunks[i], bucket.ChunkEvents(g, lim)...)
	}
	part := 0
	for i := range out {
		for _, docChunks := range cutStagedDocs(chunks[i]) {
			var id bson.ObjectID
			if retryable {
				id = DerivedID(key.OwnedBy(env.Identity), part)
			} else {
				id = env.NewObjectID()
			}
			part++
			var events []int
			for _, chunk := range docChunks {
				for _, ev := range chunk {
					events = append(events, ev.Index)
				}
			}
			var at int64
			if env.Stamp != nil {
				at = env.Stamp()
			}
			out[i].docs = append(out[i].docs, stagedDoc{doc: bucket.StagedDoc(id, docChunks, bucket.StagedOptions{At: at, Compress: lim.Compress, Format: env.Format}), events: events, fixed: retryable})
		}
	}
	return out, nil
}

// retryKeyOf is the command's retry key, as the caller read it when it
// did.
func retryKeyOf(cmd rewrite.Command, env InsertEnv) (rewrite.RetryKey, bool, error) {
	if env.Retry != nil {
		return env.Retry.Key, env.Retry.Retryable, nil
	}
	return rewrite.RetryKeyOf(cmd.Body)
}

// collIndex finds coll among out's collections: out's one collection
// (most inserts stage into one), or through byColl once there are more.
func collIndex(out []stagedCommand, byColl map[string]int, coll string) (int, bool) {
	if byColl == nil {
		return 0, len(out) == 1 && out[0].coll == coll
	}
	i, ok := byColl[coll]
	return i, ok
}

// maxStagedDocBytes bounds the events of one staged document (a chunk
// larger than that, up to the rule's maxBytes, is one alone): far below
// MongoDB's 16 MiB a document, and a fraction of a combined insert
// (MaxCombinedBytes).
const maxStagedDocBytes = 2 << 20

// cutStagedDocs groups the chunks of one insert into one staging
// collection into as few staged documents as maxStagedDocBytes allows,
// in order.
func cutStagedDocs(chunks [][]bucket.Event) [][][]bucket.Event {
	var out [][][]bucket.Event
	var size int64
	for _, c := range chunks {
		n := bucket.ChunkBytes(c)
		if len(out) == 0 || size+n > maxStagedDocBytes {
			out = append(out, nil)
			size = 0
		}
		last := len(out) - 1
		out[last] = append(out[last], c)
		size += n
	}
	return out
}

// derivedPrefix starts every derived _id: a time no ObjectID made today
// carries (2106), so derived ids are told from random ones.
var derivedPrefix = [4]byte{0xff, 0xff, 0xff, 0xff}

// DerivedID is the _id of staged document number part of a retryable
// write: the same for every attempt of that write by the same users.
func DerivedID(key rewrite.RetryKey, part int) bson.ObjectID {
	h := sha256.New()
	h.Write([]byte(key.Session))
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:8], uint64(key.TxnNumber))
	binary.BigEndian.PutUint64(buf[8:], uint64(part))
	h.Write(buf[:])
	var id bson.ObjectID
	copy(id[:4], derivedPrefix[:])
	copy(id[4:], h.Sum(nil))
	return id
}

// IsDerived says whether id is a DerivedID.
func IsDerived(id bson.ObjectID) bool { return [4]byte(id[:4]) == derivedPrefix }

// insertCommandBytes is an insert command's size but for its names and
// carried fields: its header, keys, "ordered" and string lengths.
const insertCommandBytes = 64

// insertCommand is the upstream insert of c's documents; first says
// whether it is the insert's first upstream command.
func insertCommand(db string, c stagedCommand, args rewrite.CarriedArgs, first bool) ([]byte, *rewrite.Sequence) {
	idx, body := bsoncore.AppendDocumentStart(make([]byte, 0, insertCommandBytes+len(c.coll)+len(db)+args.Bytes()))
	body = bsoncore.AppendStringElement(body, "insert", c.coll)
	body = bsoncore.AppendBooleanElement(body, "ordered", false)
	body = args.AppendTo(body, first) // startTransaction and readConcern on the first alone
	body = bsoncore.AppendStringElement(body, "$db", db)
	body, _ = bsoncore.AppendDocumentEnd(body, idx)
	seq := &rewrite.Sequence{Identifier: "documents", Documents: make([]bsoncore.Document, 0, len(c.docs))}
	for _, d := range c.docs {
		seq.Documents = append(seq.Documents, d.doc)
	}
	return body, seq
}

// outcome gathers the replies of a staged insert into the client's reply.
type outcome struct {
	n      int
	before int // of n: stored by an earlier attempt
	errs   []bucket.WriteError
	wce    bsoncore.Value
	failed bool // some statement failed: an ordered insert stops
}

func (o *outcome) stopped(ordered bool) bool { return ordered && o.failed }

// read takes the reply to c's insert.
func (o *outcome) read(c stagedCommand, reply []byte) {
	doc := bsoncore.Document(reply)
	if !mongoerr.IsOK(doc) {
		e := insert.CommandErrorOf(doc)
		for _, d := range c.docs {
			o.errs = insert.AppendEventErrors(o.errs, d.events, e.Code, e.Msg)
		}
		o.failed = true
		return
	}
	if v, err := doc.LookupErr("writeConcernError"); err == nil && o.wce.Type == 0 {
		o.wce = v
	}
	werrs := insert.ReplyWriteErrors(doc)
	for i, d := range c.docs {
		e, bad := werrs[i]
		switch {
		case !bad:
			o.n += len(d.events)
		case e.Code == mongoerr.DuplicateKey && d.fixed:
			o.n += len(d.events) // stored by an earlier attempt of this write
			o.before += len(d.events)
		default:
			o.errs = insert.AppendEventErrors(o.errs, d.events, e.Code, fmt.Sprintf("tsproxy: staging insert: %s", e.Msg))
			o.failed = true
		}
	}
}
