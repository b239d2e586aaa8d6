package rewrite

import (
	"strconv"

	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Limits of one upstream command. The server accepts command bodies up to
// 16 MiB plus a small allowance and at most 100,000 statements; a client
// batch (up to 48 MB in document sequences) can exceed that once it is
// moved into a body, so statements are spread over several commands, each
// with room left for the carried arguments.
var (
	maxCommandStatementBytes = 15 << 20
	maxCommandStatements     = 100_000
)

// statementDoc is one statement (a bucket to insert or an update) and the
// events it carries.
type statementDoc struct {
	doc  bsoncore.Document
	plan plannedStatement
}

// buildCommands turns chunks into statements — complete-bucket inserts for
// chunks of at least the insert threshold, upserts for the rest — and the
// statements into upstream commands: inserts first, then updates.
func (p *InsertPlan) buildCommands(chunks [][]event, body bsoncore.Document, rule *rules.Rule, lim limits, opts InsertOptions) {
	sess := readSession(body)
	deriveIDs := sess.retryable() && sess.lsidID.Type != 0
	var inserts, updates []statementDoc
	for _, chunk := range chunks {
		st := plannedStatement{events: eventIndexes(chunk)}
		if len(chunk) >= lim.threshold {
			id := newBucketIDFor(chunk, sess, deriveIDs, rule, opts)
			st.derivedID = deriveIDs
			inserts = append(inserts, statementDoc{doc: completeBucket(id, chunk, rule, lim), plan: st})
			continue
		}
		updates = append(updates, statementDoc{doc: upsertStatement(chunk, lim, rule.TimeField), plan: st})
	}

	args := readCarriedArgs(body)
	withStmtIDs := opts.Caps.StmtIDs && sess.retryable()
	// A retry of a partly applied batch meets duplicate keys on the buckets
	// already written; an ordered insert would stop at the first of them and
	// skip the rest, so bucket inserts with derived _ids go unordered. The
	// client's ordered still decides whether later commands run (Continue).
	insertOrdered := p.ordered && !deriveIDs
	for _, batch := range splitStatements(inserts) {
		p.addCommand("insert", "documents", insertOrdered, batch, rule, args, withStmtIDs)
	}
	for _, batch := range splitStatements(updates) {
		p.addCommand("update", "updates", p.ordered, batch, rule, args, withStmtIDs)
	}
}

func newBucketIDFor(chunk []event, sess session, derive bool, rule *rules.Rule, opts InsertOptions) bson.ObjectID {
	if derive {
		return derivedBucketID(sess, rule.BucketNamespace(), chunk[0].index, chunk[0].start)
	}
	return newBucketID(opts.NewObjectID, chunk[0].start)
}

func eventIndexes(chunk []event) []int {
	idx := make([]int, len(chunk))
	for i, ev := range chunk {
		idx[i] = ev.index
	}
	return idx
}

// splitStatements cuts statements, in order, into batches that fit one
// upstream command each.
func splitStatements(stmts []statementDoc) [][]statementDoc {
	var batches [][]statementDoc
	var cur []statementDoc
	size := 0
	for _, st := range stmts {
		if len(cur) > 0 && (len(cur) >= maxCommandStatements || size+len(st.doc) > maxCommandStatementBytes) {
			batches = append(batches, cur)
			cur, size = nil, 0
		}
		cur = append(cur, st)
		size += len(st.doc)
	}
	if len(cur) > 0 {
		batches = append(batches, cur)
	}
	return batches
}

// addCommand builds one upstream command:
//
//	{<kind>: <bucket collection>, <arrayField>: [...], ordered, stmtIds?, <carried>..., $db}
//
// stmtIds give each statement the index in the app's batch of its first
// event: distinct across all the rewritten commands of one client command
// (their events are disjoint) and the same on a retry.
func (p *InsertPlan) addCommand(kind, arrayField string, ordered bool, batch []statementDoc, rule *rules.Rule, args carriedArgs, withStmtIDs bool) {
	first := len(p.Commands) == 0
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
			doc = bsoncore.AppendInt32Element(doc, strconv.Itoa(i), int32(st.plan.events[0]))
		}
		doc, _ = bsoncore.AppendArrayEnd(doc, arr)
	}
	doc = args.appendTo(doc, first)
	doc = bsoncore.AppendStringElement(doc, "$db", rule.DB)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)

	pc := plannedCommand{kind: kind, ordered: ordered}
	for _, st := range batch {
		pc.statements = append(pc.statements, st.plan)
	}
	p.Commands = append(p.Commands, doc)
	p.upstream = append(p.upstream, pc)
}
