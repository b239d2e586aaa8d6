package layout

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/caps"
	"github.com/tsproxy/tsproxy/rewrite/insert"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// LayoutWrite is the plan of an insert on a counter or slots rule: update
// commands on the bucket collection, each statement an upsert of one
// (series, window) standing for the events of the batch that fell in it.
type Write struct {
	// Commands are run in order; stop when Continue says so.
	Commands []bsoncore.Document
	// events[c][s] are the app's indexes of the events of statement s of
	// command c.
	events   [][][]int
	rejected []bucket.WriteError
	ordered  bool
	rule     *rules.Rule
	// Buckets are the ids of the buckets the statements upsert, in plan
	// order (those found Applied excluded).
	Buckets [][12]byte
	// done counts the events of statements an earlier attempt of the
	// same write applied (CounterOptions.Applied): not sent, but counted.
	done int
}

// layoutInsert is what an insert on a layout rule has in common: the
// checked command, its events in batch order and the rejected ones.
type layoutInsert struct {
	body     bsoncore.Document
	docs     []bsoncore.Document
	ordered  bool
	lim      bucket.Limits
	rejected []bucket.WriteError
}

// checkLayoutRule makes sure rule is a rule of layout whose window is
// whole slots.
func checkLayoutRule(rule *rules.Rule, layout string) error {
	if rule == nil || rule.Layout != layout || layout != rules.LayoutCounter && layout != rules.LayoutSlots {
		return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: not a %s rule", insert.RuleName(rule), layout)
	}
	if rule.LayoutOptions.Slot <= 0 || rule.LayoutOptions.Window%rule.LayoutOptions.Slot != 0 {
		return mongoerr.Errorf(mongoerr.InternalError, "tsproxy rule %s: window %v is not a multiple of slot %v", rule.Namespace, rule.LayoutOptions.Window, rule.LayoutOptions.Slot)
	}
	return nil
}

func readLayoutInsert(cmd rewrite.Command, rule *rules.Rule, layout string) (*layoutInsert, error) {
	if err := checkLayoutRule(rule, layout); err != nil {
		return nil, err
	}
	lim, docs, ordered, err := insert.Check(cmd, rule)
	if err != nil {
		return nil, err
	}
	if rewrite.InTransaction(cmd.Body) {
		return nil, mongoerr.Errorf(mongoerr.BadValue, "tsproxy rule %s: layout %s does not support transactions", rule.Namespace, layout)
	}
	return &layoutInsert{body: cmd.Body, docs: docs, ordered: ordered, lim: lim}, nil
}

// layoutEvent is one valid event of a layout insert.
type layoutEvent struct {
	index int
	key   bucket.Key
	meta  bsoncore.Value
	slot  int
	value bsoncore.Value // slots: the valueField
}

// events reads each event's series, window and slot; check adds the
// layout's own checks. With ordered:true the batch is cut before the first
// rejected event, as a plain collection does.
func (li *layoutInsert) events(rule *rules.Rule, check func(doc bsoncore.Document, ev *layoutEvent) *bucket.WriteError) []layoutEvent {
	slotMS := rule.LayoutOptions.Slot.Milliseconds()
	out := make([]layoutEvent, 0, len(li.docs))
	for i, doc := range li.docs {
		meta, ms, start, werr := bucket.TimeMeta(doc, i, rule, li.lim)
		ev := layoutEvent{index: i, key: bucket.KeyOf(meta, start), meta: meta, slot: int((ms - start) / slotMS)}
		if werr == nil && check != nil {
			werr = check(doc, &ev)
		}
		if werr != nil {
			li.rejected = append(li.rejected, *werr)
			if li.ordered {
				break
			}
			continue
		}
		out = append(out, ev)
	}
	return out
}

// groupByKey groups events by (series, window), groups sorted by key so a
// retried batch produces the same statements; events keep batch order.
func groupByKey(evs []layoutEvent) [][]layoutEvent {
	at := map[string]int{}
	var groups [][]layoutEvent
	for _, ev := range evs {
		s := ev.key.String()
		i, ok := at[s]
		if !ok {
			i = len(groups)
			at[s] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], ev)
	}
	slices.SortFunc(groups, func(a, b []layoutEvent) int { return bucket.CompareKeys(a[0].key, b[0].key) })
	return groups
}

// CounterInsert plans an insert on a counter rule.
func CounterInsert(cmd rewrite.Command, rule *rules.Rule, caps caps.Upstream) (*Write, error) {
	return CounterInsertWith(cmd, rule, CounterOptions{Caps: caps})
}

// CounterInsertWith plans an insert on a counter rule whose upserts carry
// the write's mark, leaving out those opts.Applied says were applied (a retried
// counter insert).
func CounterInsertWith(cmd rewrite.Command, rule *rules.Rule, opts CounterOptions) (*Write, error) {
	li, err := readLayoutInsert(cmd, rule, rules.LayoutCounter)
	if err != nil {
		return nil, fmt.Errorf("rewrite counter insert %s: %w", insert.RuleName(rule), err)
	}
	groups := groupByKey(li.events(rule, nil))
	stmts := make([]layoutStmt, 0, len(groups))
	done := 0
	for _, g := range groups {
		st, err := counterStatement(rule, g, opts)
		if err != nil {
			return nil, fmt.Errorf("rewrite counter insert %s: %w", insert.RuleName(rule), err)
		}
		if opts.Applied != nil && opts.Applied(st.id) {
			done += len(st.events)
			continue
		}
		stmts = append(stmts, st)
	}
	p := li.plan(rule, opts.Caps, stmts)
	p.done = done
	return p, nil
}

// layoutStmt is one upsert statement and the events it stands for.
type layoutStmt struct {
	id     [12]byte
	doc    bsoncore.Document
	events []int
	// whole is the bucket doc upserts whole, nil for an $inc.
	whole bsoncore.Document
}

// counterStatement sums the group's events per slot into one upsert: an
// $inc, or the whole bucket where its slots are packed or are to be
// (opts.Before is then set: counterBucketOver).
func counterStatement(rule *rules.Rule, g []layoutEvent, opts CounterOptions) (layoutStmt, error) {
	idx := make([]int, len(g))
	for i, ev := range g {
		idx[i] = ev.index
	}
	id := g[0].key.ID(rule.BucketNamespace(), 0)
	if opts.Before != nil {
		before := opts.Before(g[0].key)
		if packed := packLayout(rule, opts.Caps.PackedEvents); packed || isPackedMap(before, rules.BucketSlots) {
			doc, err := counterBucketOver(rule, id, g, before, packed, opts)
			return layoutStmt{id: id, doc: upsertByID(id, doc), events: idx, whole: doc}, err
		}
	}
	counts := map[int]int64{}
	for _, ev := range g {
		counts[ev.slot]++
	}
	slots := make([]int, 0, len(counts))
	for s := range counts {
		slots = append(slots, s)
	}
	slices.Sort(slots)
	k := g[0].key

	ui, u := bsoncore.AppendDocumentStart(nil)
	ii, u := bsoncore.AppendDocumentElementStart(u, "$inc")
	for _, s := range slots {
		u = bsoncore.AppendInt64Element(u, rules.BucketSlots+"."+strconv.Itoa(s), counts[s])
	}
	u = bsoncore.AppendInt64Element(u, rules.BucketTotal, int64(len(g)))
	u, _ = bsoncore.AppendDocumentEnd(u, ii)
	u = appendSetOnInsert(u, g[0].meta, k.Start)
	if opts.WriteID != "" {
		u = appendMark(u, opts.WriteID, opts.Now)
	}
	if opts.mergeMark != "" {
		u = bsoncore.AppendDocumentElement(u, "$set", bsoncore.NewDocumentBuilder().AppendString(CounterMerged, opts.mergeMark).Build())
	}
	u, _ = bsoncore.AppendDocumentEnd(u, ui)
	return layoutStmt{id: id, doc: upsertByID(id, u), events: idx}, nil
}

func appendSetOnInsert(dst []byte, meta bsoncore.Value, start int64) []byte {
	si, dst := bsoncore.AppendDocumentElementStart(dst, "$setOnInsert")
	dst = bsoncore.AppendValueElement(dst, bucket.FieldMeta, meta)
	dst = bsoncore.AppendDateTimeElement(dst, bucket.FieldStart, start)
	dst, _ = bsoncore.AppendDocumentEnd(dst, si)
	return dst
}

// upsertByID is the statement {q: {_id: id}, u: update, upsert: true}.
func upsertByID(id [12]byte, update bsoncore.Document) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().
		AppendDocument("q", bsoncore.NewDocumentBuilder().AppendObjectID("_id", id).Build()).
		AppendDocument("u", update).
		AppendBoolean("upsert", true).
		Build()
}

// plan splits the statements into update commands of at most
// caps.MaxUpdateStatements statements.
func (li *layoutInsert) plan(rule *rules.Rule, caps caps.Upstream, stmts []layoutStmt) *Write {
	p := &Write{rejected: li.rejected, ordered: li.ordered, rule: rule}
	per := len(stmts)
	if caps.MaxUpdateStatements > 0 {
		per = caps.MaxUpdateStatements
	}
	// The client's arguments go on as for the events layout; a retryable
	// write also gets stmtIds where the upstream takes them (MongoDB), so a
	// driver's retry of a counted batch is recognised, not counted twice.
	// Each statement's stmtId is the app index of its first event:
	// distinct, since the statements' events are disjoint.
	args := rewrite.ReadCarriedArgs(li.body)
	withStmtIDs := caps.StmtIDs && rewrite.ReadSession(li.body).Retryable()
	for lo := 0; lo < len(stmts); lo += per {
		batch := stmts[lo:min(lo+per, len(stmts))]
		ci, c := bsoncore.AppendDocumentStart(nil)
		c = bsoncore.AppendStringElement(c, "update", rule.BucketCollection)
		ai, c := bsoncore.AppendArrayElementStart(c, "updates")
		evs := make([][]int, len(batch))
		for i, s := range batch {
			c = bsoncore.AppendDocumentElement(c, strconv.Itoa(i), s.doc)
			evs[i] = s.events
			p.Buckets = append(p.Buckets, s.id)
		}
		c, _ = bsoncore.AppendArrayEnd(c, ai)
		c = bsoncore.AppendBooleanElement(c, "ordered", li.ordered)
		if withStmtIDs {
			si, d := bsoncore.AppendArrayElementStart(c, "stmtIds")
			for i, s := range batch {
				d = bsoncore.AppendInt32Element(d, strconv.Itoa(i), int32(s.events[0]))
			}
			c, _ = bsoncore.AppendArrayEnd(d, si)
		}
		c = args.AppendTo(c, lo == 0)
		c = bsoncore.AppendStringElement(c, "$db", rule.DB)
		c, _ = bsoncore.AppendDocumentEnd(c, ci)
		p.Commands = append(p.Commands, c)
		p.events = append(p.events, evs)
	}
	return p
}

// Continue reports whether to run the command after command i, given its
// reply: an ordered insert stops at the first failure.
func (p *Write) Continue(i int, reply bsoncore.Document) bool {
	if !p.ordered {
		return true
	}
	return mongoerr.IsOK(reply) && len(insert.ReplyWriteErrors(reply)) == 0
}

// Reply is the app's insert reply: n is the events the acknowledged
// statements stand for (counted, for a counter; written, for slots), and
// writeErrors name the app's own indexes: rejected events, the events of a
// failed statement, and those of statements an ordered insert did not run.
func (p *Write) Reply(replies [][]byte) []byte {
	n := p.done
	errs := append([]bucket.WriteError(nil), p.rejected...)
	var wce bsoncore.Value
	var stop *insert.UpstreamError
	for c, stmts := range p.events {
		if c >= len(replies) || stop != nil {
			errs = p.notRun(errs, stmts, stop)
			continue
		}
		reply := bsoncore.Document(replies[c])
		if v, ok := bsonutil.Lookup(reply, "writeConcernError"); ok && wce.Type == 0 {
			wce = v
		}
		if !mongoerr.IsOK(reply) {
			e := insert.CommandErrorOf(reply)
			errs = p.notRun(errs, stmts, &e)
			if p.ordered {
				stop = &e
			}
			continue
		}
		failed := insert.ReplyWriteErrors(reply)
		for s, evs := range stmts {
			if e, ok := failed[s]; ok {
				errs = insert.AppendEventErrors(errs, evs, e.Code, p.errmsg(e.Msg))
				if p.ordered {
					stop = &e
					errs = p.notRun(errs, stmts[s+1:], stop)
					break
				}
				continue
			}
			n += len(evs)
		}
	}
	return insert.WriteReply(n, errs, wce, bsoncore.Value{})
}

func (p *Write) errmsg(upstream string) string {
	return fmt.Sprintf("tsproxy rule %s: bucket update failed: %s", p.rule.Namespace, upstream)
}

// notRun reports the events of statements that did not run (or whose
// command failed as a whole).
func (p *Write) notRun(errs []bucket.WriteError, stmts [][]int, cause *insert.UpstreamError) []bucket.WriteError {
	code, msg := mongoerr.InternalError, fmt.Sprintf("tsproxy rule %s: not written: an earlier bucket update of this ordered insert failed", p.rule.Namespace)
	if cause != nil {
		code, msg = cause.Code, p.errmsg(cause.Msg)
	}
	for _, evs := range stmts {
		errs = insert.AppendEventErrors(errs, evs, code, msg)
	}
	return errs
}
