package insert

import (
	"cmp"
	"fmt"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// buildCommands plans the events, group by group (series and window, in
// order of first appearance), against the fills of their keys: the open
// bucket (seq n) takes, with one upsert, the events that fit in it; the
// rest goes, chunk by chunk, to new buckets n+1, n+2, ... — inserted whole
// when a chunk has at least the insert threshold of events, else created
// by an upsert. Where updates are costly (Caps.CostlyUpdates) every new
// bucket is inserted whole: FerretDB runs an upsert that creates a
// document as a find, an update of an empty document and an insert, at
// several times the cost of the insert alone, and its fills are exact (a
// stale one makes the insert meet a duplicate key, which Retry re-plans as
// it does for a complete bucket). Statements become upstream commands:
// inserts first, then updates.
func (p *Commands) buildCommands(events []bucket.Event) { p.buildGroups(bucket.GroupEvents(events)) }

// buildGroups is buildCommands for events already grouped.
func (p *Commands) buildGroups(groups [][]bucket.Event) {
	rule, lim := p.rule, p.lim
	ns := rule.BucketNamespace()
	idOnly := p.opts.Caps.IDOnlyFilters
	var inserts, updates []statementDoc
	for _, g := range groups {
		key := bucket.KeyOf(g[0].Meta, g[0].Start)
		fill := bucket.Fill{Seq: -1}
		if p.opts.Buckets != nil {
			if f := p.opts.Buckets(key); f.Known && f.Seq >= 0 {
				fill = f
			}
		}
		ki := len(p.fills)
		rest := g
		if fill.Seq >= 0 && p.mayJoin(fill, len(g)) {
			k, b := 0, int64(0)
			for k < len(rest) {
				size := int64(len(rest[k].Stored))
				if fill.Count+k+1 > lim.MaxEvents || fill.Bytes+b+size > lim.MaxBytes {
					break
				}
				k++
				b += size
			}
			if k > 0 {
				chunk := rest[:k]
				st := plannedStatement{events: eventIndexes(chunk), chunk: chunk, key: ki, seq: fill.Seq}
				id := bucket.ID(ns, g[0].Meta, g[0].Start, fill.Seq)
				updates = append(updates, statementDoc{doc: bucket.UpsertStatement(id, chunk, lim, rule.TimeField, idOnly), plan: st})
				fill.Count += k
				fill.Bytes += b
			}
			rest = rest[k:]
		}
		for _, chunk := range bucket.ChunkEvents(rest, lim) {
			fill = bucket.Fill{Seq: fill.Seq + 1, Count: len(chunk), Bytes: bucket.ChunkBytes(chunk)}
			st := plannedStatement{events: eventIndexes(chunk), chunk: chunk, key: ki, seq: fill.Seq}
			id := bucket.ID(ns, g[0].Meta, g[0].Start, fill.Seq)
			if len(chunk) >= lim.Threshold || p.opts.Caps.CostlyUpdates {
				inserts = append(inserts, statementDoc{doc: bucket.Complete(id, chunk, rule, lim), plan: st})
			} else {
				updates = append(updates, statementDoc{doc: bucket.UpsertStatement(id, chunk, lim, rule.TimeField, idOnly), plan: st})
			}
		}
		fill.Known = true
		p.fills = append(p.fills, plannedFill{key: key, fill: fill})
	}

	sess := rewrite.ReadSession(p.body)
	args := rewrite.ReadCarriedArgs(p.body)
	withStmtIDs := p.opts.Caps.StmtIDs && sess.Retryable()
	maxBytes := cmp.Or(p.opts.MaxCommandBytes, maxCommandStatementBytes)
	for _, batch := range splitStatements(inserts, maxCommandStatements, maxBytes) {
		p.addCommand("insert", "documents", p.ordered, batch, rule, args, withStmtIDs)
	}
	maxUpdates := maxCommandStatements
	if n := p.opts.Caps.MaxUpdateStatements; n > 0 {
		maxUpdates = min(n, maxUpdates)
	}
	for _, batch := range splitStatements(updates, maxUpdates, maxBytes) {
		p.addCommand("update", "updates", p.ordered, batch, rule, args, withStmtIDs)
	}
}

// addCommand builds one upstream command:
//
//	{<kind>: <bucket collection>, <arrayField>: [...], ordered, stmtIds?, <carried>..., $db}
//
// stmtIds give each statement the index in the app's batch of its first
// event: distinct across all the rewritten commands of one client command
// (their events are disjoint), and kept by a statement that Retry plans
// again from the same first event. The first-command-only arguments
// (startTransaction, readConcern) go on the first command of the first
// round.
func (p *Commands) addCommand(kind, arrayField string, ordered bool, batch []statementDoc, rule *rules.Rule, args rewrite.CarriedArgs, withStmtIDs bool) {
	first := len(p.Commands) == 0 && p.round == 0
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, kind, rule.BucketCollection)
	arr, doc := bsoncore.AppendArrayElementStart(doc, arrayField)
	for i, st := range batch {
		doc = bsoncore.AppendDocumentElement(doc, strconv.Itoa(i), st.doc)
	}
	doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	doc = bsoncore.AppendBooleanElement(doc, "ordered", ordered)
	if withStmtIDs {
		arr, doc = bsoncore.AppendArrayElementStart(doc, "stmtIds")
		for i, st := range batch {
			id := st.plan.events[0]
			if id < len(p.opts.StmtIDs) {
				id = p.opts.StmtIDs[id]
			}
			doc = bsoncore.AppendInt32Element(doc, strconv.Itoa(i), int32(id))
		}
		doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	}
	doc = args.AppendTo(doc, first)
	doc = bsoncore.AppendStringElement(doc, "$db", rule.DB)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)

	pc := plannedCommand{kind: kind, ordered: ordered}
	for _, st := range batch {
		pc.statements = append(pc.statements, st.plan)
	}
	p.Commands = append(p.Commands, doc)
	p.upstream = append(p.upstream, pc)
}

// mayJoin says whether a group of k events may be pushed into the open
// bucket described by fill. Always where updates are cheap (MongoDB
// updates a document in place); where an update rewrites the whole
// document (Caps.CostlyUpdates: FerretDB, about 75 µs per stored event
// measured), only into a bucket still below the insert threshold and only
// for a group below it, so an update never rewrites a large bucket and a
// large group is inserted as buckets of its own.
func (p *Commands) mayJoin(fill bucket.Fill, k int) bool {
	if !p.opts.Caps.CostlyUpdates {
		return true
	}
	return fill.Count < p.lim.Threshold && k < p.lim.Threshold
}

// IsUpdate reports whether Commands[i] is an update command (of upserts)
// rather than an insert of complete buckets: only updates hold FerretDB's
// SQLite connections while they run (see Caps.MaxUpdateStatements).
func (p *Commands) IsUpdate(i int) bool {
	return i >= 0 && i < len(p.upstream) && p.upstream[i].kind == "update"
}

// CommandSections is Commands[i] split as an OP_MSG carries it best: the
// body without its statements, and the statements ("documents" or
// "updates") as a document sequence of that identifier. An upstream then
// need not decode the statements as part of the body: FerretDB v1.24
// decodes a body twice (once to route it), so a bucket insert sent whole
// in the body cost it twice the decoding of the same events sent by a
// driver, which uses a sequence (measured with tsbench -cpuprofile). The
// statements alias Commands[i].
func (p *Commands) CommandSections(i int) (body []byte, identifier string, statements [][]byte, err error) {
	if i < 0 || i >= len(p.Commands) {
		return nil, "", nil, fmt.Errorf("rewrite insert %s: no command %d", p.namespace, i)
	}
	identifier = "documents"
	if p.upstream[i].kind == "update" {
		identifier = "updates"
	}
	cmd := p.Commands[i]
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, 256))
	rem := cmd[4 : len(cmd)-1]
	for len(rem) > 0 {
		e, rest, ok := bsoncore.ReadElement(rem)
		if !ok {
			return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d is malformed", p.namespace, i)
		}
		rem = rest
		if string(e.KeyBytes()) != identifier {
			out = append(out, e...)
			continue
		}
		arr, ok := e.Value().ArrayOK()
		if !ok {
			return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d: %q is not an array", p.namespace, i, identifier)
		}
		statements = make([][]byte, 0, len(p.upstream[i].statements))
		vals := arr[4 : len(arr)-1]
		for len(vals) > 0 {
			v, rest, ok := bsoncore.ReadElement(vals)
			if !ok {
				return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d: malformed %q", p.namespace, i, identifier)
			}
			vals = rest
			d, ok := v.Value().DocumentOK()
			if !ok {
				return nil, "", nil, fmt.Errorf("rewrite insert %s: command %d: %q holds a non-document", p.namespace, i, identifier)
			}
			statements = append(statements, d)
		}
	}
	body, _ = bsoncore.AppendDocumentEnd(out, idx)
	return body, identifier, statements, nil
}
