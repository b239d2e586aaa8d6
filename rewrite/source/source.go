package source

import (
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rules"
)

// Collection is one collection holding a rule's buckets.
type Collection struct {
	Name string
	// Start is a partition's period start (ms since the epoch); 0 for a
	// rule that is not partitioned.
	Start int64
}

// Lister is the plan that lists a rule's bucket collections; once it is
// done, Collections holds them in time order.
type Lister struct {
	rewrite.Plan
	rule  *rules.Rule
	colls []Collection
}

// Release forwards to the embedded plan (rewrite.ReleasePlan).
func (l *Lister) Release() { rewrite.ReleasePlan(l.Plan) }

// List lists rule's bucket collections. A rule that is not partitioned
// has one, known without asking the upstream; a partitioned rule's are
// the existing partitions (listCollections on its database, names
// matched here, as not every upstream filters names by regex).
func List(rule *rules.Rule) *Lister {
	l := &Lister{rule: rule}
	if !rule.Partitioned() {
		l.colls = []Collection{{Name: rule.BucketCollection}}
		l.Plan = rewrite.Done(rewrite.Result{})
		return l
	}
	l.Plan = rewrite.Drain(ListCommand(rule.DB), rule.DB, "$cmd.listCollections", l.take, func() rewrite.Result {
		slices.SortFunc(l.colls, func(a, b Collection) int { return int(min(max(a.Start-b.Start, -1), 1)) })
		return rewrite.Result{}
	})
	return l
}

func (l *Lister) take(docs []bsoncore.Document) error {
	for _, d := range docs {
		name, _ := d.Lookup("name").StringValueOK()
		if start, ok := l.rule.ParsePartition(name); ok {
			l.colls = append(l.colls, Collection{Name: name, Start: start})
		}
	}
	return nil
}

// Collections are the rule's bucket collections in time order.
func (l *Lister) Collections() []Collection { return l.colls }

// ListCommand lists the names of db's collections.
func ListCommand(db string) []byte {
	return bsoncore.NewDocumentBuilder().AppendInt32("listCollections", 1).
		AppendBoolean("nameOnly", true).AppendString("$db", db).Build()
}

// DropCommand drops db.coll: a partition, a rollup collection, a
// staging collection.
func DropCommand(db, coll string) []byte {
	return bsoncore.NewDocumentBuilder().AppendString("drop", coll).AppendString("$db", db).Build()
}

// Names is the plan that lists every collection name of a database; once
// it is done, Names holds them.
type Names struct {
	rewrite.Plan
	names []string
}

// Release forwards to the embedded plan (rewrite.ReleasePlan).
func (n *Names) Release() { rewrite.ReleasePlan(n.Plan) }

// ListNames lists db's collection names.
func ListNames(db string) *Names {
	n := &Names{}
	n.Plan = rewrite.Drain(ListCommand(db), db, "$cmd.listCollections", func(docs []bsoncore.Document) error {
		for _, d := range docs {
			if name, ok := d.Lookup("name").StringValueOK(); ok {
				n.names = append(n.names, name)
			}
		}
		return nil
	}, func() rewrite.Result { return rewrite.Result{} })
	return n
}

// Names are the collection names listed.
func (n *Names) Names() []string { return n.names }
