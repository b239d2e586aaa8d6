package admin

import (
	"strings"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/source"
	"github.com/tsproxy/tsproxy/rewrite/stage"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The plans of the admin commands of a rule's namespace.

// Create creates the rule's bucket collection (see PlanCreate).
func Create(body []byte, rule *rules.Rule) rewrite.Plan {
	cmd, err := PlanCreate(body, rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	return rewrite.Passthrough(cmd, func(r []byte) []byte { return Reply(r, rule) })
}

// CreateIndexes creates the app's indexes on the bucket collection;
// ownVirtual as for PlanCreateIndexes.
func CreateIndexes(body []byte, rule *rules.Rule, ownVirtual bool) rewrite.Plan {
	cmd, err := PlanCreateIndexes(body, rule, ownVirtual)
	if err != nil {
		return rewrite.Fail(err)
	}
	if cmd == nil {
		return ownIndexExists(rule)
	}
	return rewrite.Passthrough(cmd, func(r []byte) []byte { return Reply(r, rule) })
}

// ownIndexExists answers a createIndexes of only the proxy's virtual own
// index as MongoDB answers one of an index that exists: the bucket
// collection is created when it is not there (as createIndexes creates
// it), and the indexes counted as listIndexes shows them.
func ownIndexExists(rule *rules.Rule) rewrite.Plan {
	return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
		reply, ok := x.One(bucket.CreateCommand(rule.DB, rule.BucketCollection))
		if !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		err := mongoerr.ReplyError(reply)
		created := err == nil
		if err != nil && mongoerr.CodeOf(err) != mongoerr.NamespaceExists {
			return rewrite.Result{Reply: Reply(reply, rule)}, nil
		}
		// Without the create's generic arguments: a writeConcern is refused
		// on a read.
		list := bsoncore.NewDocumentBuilder().AppendString("listIndexes", rule.BucketCollection).AppendString("$db", rule.DB).Build()
		if reply, ok = x.One(list); !ok {
			return rewrite.Result{}, rewrite.ErrAborted
		}
		listed := ListIndexesReply(reply, rule, true)
		if !mongoerr.IsOK(listed) {
			return rewrite.Result{Reply: listed}, nil
		}
		specs, _, err := cursor.Docs(listed)
		if err != nil {
			return rewrite.Result{}, err
		}
		b := bsoncore.NewDocumentBuilder().AppendInt32("numIndexesBefore", int32(len(specs))).AppendInt32("numIndexesAfter", int32(len(specs)))
		if created {
			b.AppendBoolean("createdCollectionAutomatically", true)
		}
		return rewrite.Result{Reply: b.AppendString("note", "all indexes already exist").AppendDouble("ok", 1).Build()}, nil
	})
}

// ListIndexes lists the bucket collection's indexes as the app's;
// ownVirtual as for ListIndexesReply.
func ListIndexes(body []byte, rule *rules.Rule, ownVirtual bool) rewrite.Plan {
	cmd, err := PlanListIndexes(body, rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	return rewrite.Passthrough(cmd, func(r []byte) []byte { return ListIndexesReply(r, rule, ownVirtual) })
}

// DropIndexes drops the app's indexes from the bucket collection. After
// "*" (every index) the bucket namespace is forgotten, so that the proxy
// creates its own index again.
func DropIndexes(body []byte, rule *rules.Rule) rewrite.Plan {
	cmd, recreate, err := PlanDropIndexes(body, rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	return rewrite.Single(rewrite.Upstream{Body: cmd}, func(reply []byte) (rewrite.Result, error) {
		res := rewrite.Result{Reply: Reply(reply, rule)}
		if recreate {
			res.Forget = []string{rule.BucketNamespace()}
		}
		return res, nil
	})
}

// CollStats answers collStats, or an aggregate beginning with $collStats,
// from the bucket collection: its statistics, then the events counted by
// summing the buckets' counts (or, where the upstream refuses that, by
// unwinding them).
func CollStats(body []byte, rule *rules.Rule) rewrite.Plan {
	p, err := PlanCollStats(body, rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	return &collStats{p: p, count: -1}
}

type collStats struct {
	p     *CollStatsPlan
	step  int // 0: statistics, 1: count, 2: count by unwinding, 3: done
	stats []byte
	count int64
}

func (c *collStats) Next() (rewrite.Step, bool) {
	switch c.step {
	case 0:
		return rewrite.Step{{Body: c.p.Stats}}, false
	case 1:
		return rewrite.Step{{Body: c.p.Count}}, false
	case 2:
		return rewrite.Step{{Body: c.p.CountFallback}}, false
	}
	return nil, true
}

func (c *collStats) Feed(replies [][]byte) error {
	switch c.step {
	case 0:
		c.stats, c.step = replies[0], 1
	case 1, 2:
		if n, ok := c.p.CountFrom(replies[0]); ok {
			c.count, c.step = n, 3
		} else {
			c.step++
		}
	}
	return nil
}

func (c *collStats) Result() rewrite.Result {
	return rewrite.Result{Reply: c.p.Reply(c.stats, c.count)}
}

// Drop drops every collection holding the rule's events (its bucket
// collection, or its partitions) and its rollups, and answers as the drop
// of a plain collection. The proxy forgets what it kept of them.
func Drop(body []byte, rule *rules.Rule) rewrite.Plan {
	cmd, err := PlanDrop(body, rule)
	if err != nil {
		return rewrite.Fail(err)
	}
	colls := source.List(rule)
	return rewrite.Then(colls, func(rewrite.Result) rewrite.Plan {
		d := &dropPlan{rule: rule, cmd: cmd}
		if rule.Partitioned() {
			for _, c := range colls.Collections() {
				d.drops = append(d.drops, c.Name)
			}
		}
		for _, res := range rule.Rollups {
			d.rollups = append(d.rollups, rule.RollupCollection(res))
		}
		if rule.Layout == rules.LayoutEvents {
			d.rollups = append(d.rollups, stage.TxnsCollection(rule), rule.IDIndexCollection(), rule.UpdateJournalCollection())
		}
		return d
	})
}

// dropPlan drops the partitions, then the bucket collection (whose reply
// the client gets), then the rollups (their failures are the proxy's to
// log, not the client's: its events are gone either way).
type dropPlan struct {
	rule    *rules.Rule
	cmd     []byte
	drops   []string // partitions
	rollups []string
	step    int
	reply   []byte
	failed  []byte
}

func (d *dropPlan) Next() (rewrite.Step, bool) {
	switch {
	case d.step < len(d.drops):
		return rewrite.Step{{Body: source.DropCommand(d.rule.DB, d.drops[d.step])}}, false
	case d.step == len(d.drops):
		return rewrite.Step{{Body: d.cmd}}, false
	case d.step <= len(d.drops)+len(d.rollups):
		return rewrite.Step{{Body: source.DropCommand(d.rule.DB, d.rollups[d.step-len(d.drops)-1])}}, false
	}
	return nil, true
}

func (d *dropPlan) Feed(replies [][]byte) error {
	reply := bsoncore.Document(replies[0])
	gone := mongoerr.IsOK(reply) || mongoerr.FromReply(reply, "").Code == mongoerr.NamespaceNotFound
	switch {
	case d.step < len(d.drops) && !gone:
		return mongoerr.Errorf(mongoerr.FromReply(reply, "").Code, "tsproxy rule %s: drop partition %s: %s", d.rule.Namespace, d.drops[d.step], mongoerr.FromReply(reply, "").Msg)
	case d.step == len(d.drops):
		d.reply = DropReply(reply, d.rule)
		if len(d.drops) > 0 && !mongoerr.IsOK(reply) && gone {
			// The partitions were the events; the bucket collection of the
			// rule's name was never written.
			d.reply = bsoncore.NewDocumentBuilder().AppendString("ns", d.rule.Namespace).AppendDouble("ok", 1).Build()
		}
	case d.step > len(d.drops) && !gone && d.failed == nil:
		d.failed = replies[0]
	}
	d.step++
	return nil
}

func (d *dropPlan) Result() rewrite.Result {
	res := rewrite.Result{Reply: d.reply, Forget: []string{d.rule.BucketNamespace()}}
	for _, c := range d.drops {
		res.Forget = append(res.Forget, d.rule.DB+"."+c)
	}
	for _, c := range d.rollups {
		res.Forget = append(res.Forget, d.rule.DB+"."+c)
	}
	if d.failed != nil {
		// Reported by the proxy as work after the reply that failed.
		res.After = rewrite.Done(rewrite.Result{Reply: d.failed})
	}
	return res
}

// ListCollections lists db's collections as the app sees them, rs being
// the rules of db: a partitioned rule's first partition shows under the
// app's name (listed first, so that a name filter on the app's name finds
// it).
func ListCollections(body []byte, db string, rs []*rules.Rule) rewrite.Plan {
	var listers []*source.Lister
	var partitioned []*rules.Rule
	for _, r := range rs {
		if r.Partitioned() {
			listers = append(listers, source.List(r))
			partitioned = append(partitioned, r)
		}
	}
	var first rewrite.Plan = rewrite.Done(rewrite.Result{})
	for _, l := range listers {
		prev, l := first, l
		first = rewrite.Then(prev, func(rewrite.Result) rewrite.Plan { return l })
	}
	return rewrite.Then(first, func(rewrite.Result) rewrite.Plan {
		var firstPartition map[string]string
		for i, l := range listers {
			if cs := l.Collections(); len(cs) > 0 {
				if firstPartition == nil {
					firstPartition = map[string]string{}
				}
				firstPartition[partitioned[i].Collection] = cs[0].Name
			}
		}
		p, err := PlanListCollectionsPartitioned(body, db, rs, firstPartition)
		if err != nil {
			return rewrite.Fail(err)
		}
		return &listPlan{p: p, next: p.Command}
	})
}

type listPlan struct {
	p    *ListCollectionsPlan
	next []byte
}

func (l *listPlan) Next() (rewrite.Step, bool) {
	if l.next == nil {
		return nil, true
	}
	return rewrite.Step{{Body: l.next}}, false
}

func (l *listPlan) Feed(replies [][]byte) error {
	l.next = l.p.Feed(replies[0])
	return nil
}

func (l *listPlan) Result() rewrite.Result { return rewrite.Result{Reply: l.p.Result()} }

// DropStaging drops a rule's staging collections (events not merged into
// buckets yet), so that a namespace created again after a drop starts
// empty. Failed drops are the proxy's to log: its reply lists them.
func DropStaging(rule *rules.Rule) rewrite.Plan {
	var names []string
	list := rewrite.Drain(source.ListCommand(rule.DB), rule.DB, "$cmd.listCollections", func(docs []bsoncore.Document) error {
		for _, d := range docs {
			if name, _ := d.Lookup("name").StringValueOK(); strings.HasPrefix(name, rule.StagePrefix()) {
				names = append(names, name)
			}
		}
		return nil
	}, func() rewrite.Result { return rewrite.Result{} })
	return rewrite.Then(list, func(rewrite.Result) rewrite.Plan {
		if len(names) == 0 {
			return rewrite.Done(rewrite.Result{})
		}
		bodies := make([][]byte, len(names))
		for i, n := range names {
			bodies[i] = source.DropCommand(rule.DB, n)
		}
		return rewrite.Script(func(x *rewrite.Exec) (rewrite.Result, error) {
			replies, ok := x.Do(rewrite.StepOf(bodies))
			if !ok {
				return rewrite.Result{}, rewrite.ErrAborted
			}
			var failed []string
			for i, r := range replies {
				// A collection whose table FerretDB on PostgreSQL lost
				// holds nothing and can never be
				// dropped: not a failure.
				if !mongoerr.IsOK(r) && !mongoerr.DroppedUnderQueryReply(r) {
					failed = append(failed, names[i])
				}
			}
			if len(failed) > 0 {
				return rewrite.Result{}, mongoerr.Errorf(mongoerr.OperationFailed, "staging collections not dropped: %s", strings.Join(failed, ", "))
			}
			return rewrite.Result{}, nil
		})
	})
}
