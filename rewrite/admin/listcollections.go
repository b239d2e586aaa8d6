package admin

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/match"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rules"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ListCollectionsPlan shows a database's collections as the app sees them:
// each rule's bucket collection under the app's collection name, and the
// app's own (empty) upstream collection hidden. The proxy sends Command,
// feeds every reply to Feed (sending the getMore it returns) and answers
// with Result: one batch, cursor id 0 (collection lists are small).
type ListCollectionsPlan struct {
	Command []byte

	db       string
	byBucket map[string]*rules.Rule
	byApp    map[string]*rules.Rule
	docs     []bsoncore.Document
	errReply []byte
	extra    []bsoncore.Element // top-level reply fields besides cursor and ok
	shown    map[*rules.Rule]bool
	nameOnly bool
	// firstPartition: see PlanListCollectionsPartitioned.
	firstPartition map[string]string
	// post, when set, is the client's whole filter, applied to the
	// listing as the app sees it: a filter on anything but the name
	// (type, options, info) matched the bucket collection's own entry
	// upstream ({type: "timeseries"} found nothing, {type: "collection"}
	// the time-series collections), so the upstream gets its name part
	// alone and the proxy filters what it shows.
	post match.DocPred
}

// PlanListCollections rewrites listCollections on db, where rs are the
// rules of that database. A filter on name may be a string, $eq or $in of
// strings: app names become bucket names; other forms of name filter are
// refused (they would match bucket names, not the app's).
func PlanListCollections(body []byte, db string, rs []*rules.Rule) (*ListCollectionsPlan, error) {
	return PlanListCollectionsPartitioned(body, db, rs, nil)
}

// PlanListCollectionsPartitioned is PlanListCollections where a
// partitioned rule's app name in a name filter asks for its first
// existing partition (firstPartition: app collection -> partition
// collection; see rewrite/fanout), shown under the app's name.
func PlanListCollectionsPartitioned(body []byte, db string, rs []*rules.Rule, firstPartition map[string]string) (*ListCollectionsPlan, error) {
	doc := bsoncore.Document(body)
	p := &ListCollectionsPlan{db: db, byBucket: map[string]*rules.Rule{}, byApp: map[string]*rules.Rule{}, firstPartition: firstPartition, nameOnly: nameOnly(body)}
	for _, r := range rs {
		p.byBucket[r.BucketCollection] = r
		p.byApp[r.Collection] = r
	}
	elems, _ := doc.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		switch e.Key() {
		case "filter":
			f, ok := e.Value().DocumentOK()
			if !ok {
				out = append(out, e...) // let the upstream refuse it
				continue
			}
			if hasOtherThanName(f) {
				fc := match.Compiler{Unsupported: func(format string, args ...any) error {
					return p.refuse("filter: "+format+" is not supported on a database with bucketed namespaces", args...)
				}}
				post, err := fc.Compile(f, 0)
				if err != nil {
					return nil, err
				}
				p.post = post
				f = nameOnlyFilter(f)
			}
			nf, err := p.mapFilter(f)
			if err != nil {
				return nil, err
			}
			out = bsoncore.AppendDocumentElement(out, "filter", nf)
		case "cursor":
			// One batch of everything: the proxy reads all batches.
		default:
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	p.Command = out
	return p, nil
}

// hasOtherThanName says whether filter f asks for more than the name.
func hasOtherThanName(f bsoncore.Document) bool {
	elems, _ := f.Elements()
	for _, e := range elems {
		if e.Key() != "name" {
			return true
		}
	}
	return false
}

// nameOnlyFilter is f's top-level name condition alone ({} without one).
func nameOnlyFilter(f bsoncore.Document) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder()
	if v, err := f.LookupErr("name"); err == nil {
		b.AppendValue("name", v)
	}
	return b.Build()
}

func (p *ListCollectionsPlan) refuse(format string, args ...any) error {
	names := ""
	for app := range p.byApp {
		names = p.db + "." + app
		break
	}
	return mongoerr.Errorf(mongoerr.NotImplemented, "tsproxy rule %s: listCollections %s", names, fmt.Sprintf(format, args...))
}

// bucketName maps an app collection name to the name to ask upstream.
func (p *ListCollectionsPlan) bucketName(name string) string {
	if r := p.byApp[name]; r != nil {
		if first := p.firstPartition[name]; r.Partitioned() && first != "" {
			return first
		}
		return r.BucketCollection
	}
	if p.byBucket[name] != nil {
		// The bucket collection itself is shown under the app's name only.
		return "\x00tsproxy-hidden"
	}
	return name
}

func (p *ListCollectionsPlan) mapFilter(f bsoncore.Document) (bsoncore.Document, error) {
	elems, err := f.Elements()
	if err != nil {
		return nil, mongoerr.Errorf(mongoerr.InvalidBSON, "listCollections filter is not valid BSON: %v", err)
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		k := e.Key()
		if k != "name" {
			if k == "$and" || k == "$or" || k == "$nor" || k == "$expr" || k == "$where" {
				if containsName(e.Value()) {
					return nil, p.refuse("filter on \"name\" inside %s is not supported on a database with bucketed namespaces", k)
				}
			}
			out = append(out, e...)
			continue
		}
		v := e.Value()
		if s, ok := v.StringValueOK(); ok {
			out = bsoncore.AppendStringElement(out, "name", p.bucketName(s))
			continue
		}
		ops, ok := v.DocumentOK()
		if !ok {
			return nil, p.refuse("filter on \"name\" by a %s is not supported on a database with bucketed namespaces (use a string, $eq or $in)", bsonutil.TypeName(v.Type))
		}
		oe, _ := ops.Elements()
		oidx, o := bsoncore.AppendDocumentElementStart(out, "name")
		for _, op := range oe {
			switch op.Key() {
			case "$eq":
				s, ok := op.Value().StringValueOK()
				if !ok {
					return nil, p.refuse("filter name $eq must be a string")
				}
				o = bsoncore.AppendStringElement(o, "$eq", p.bucketName(s))
			case "$in":
				arr, ok := op.Value().ArrayOK()
				if !ok {
					return nil, p.refuse("filter name $in must be an array of strings")
				}
				vals, _ := arr.Values()
				aidx, a := bsoncore.AppendArrayElementStart(o, "$in")
				for i, item := range vals {
					s, ok := item.StringValueOK()
					if !ok {
						return nil, p.refuse("filter name $in must be an array of strings")
					}
					a = bsoncore.AppendStringElement(a, strconv.Itoa(i), p.bucketName(s))
				}
				o, _ = bsoncore.AppendArrayEnd(a, aidx)
			default:
				return nil, p.refuse("filter on \"name\" with %s is not supported on a database with bucketed namespaces (use a string, $eq or $in)", op.Key())
			}
		}
		out, _ = bsoncore.AppendDocumentEnd(o, oidx)
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, nil
}

func containsName(v bsoncore.Value) bool {
	switch v.Type {
	case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
		elems, _ := bsoncore.Document(v.Data).Elements()
		for _, e := range elems {
			if e.Key() == "name" || containsName(e.Value()) {
				return true
			}
		}
	}
	return false
}

// Feed takes one upstream reply; it returns the getMore to send next, or
// nil when done.
func (p *ListCollectionsPlan) Feed(reply []byte) []byte {
	doc := bsoncore.Document(reply)
	if doc.Validate() != nil || !mongoerr.IsOK(doc) {
		p.errReply = append([]byte(nil), reply...)
		return nil
	}
	cur, err := doc.LookupErr("cursor")
	if err != nil {
		p.errReply = mongoerr.Reply(mongoerr.Errorf(mongoerr.InternalError, "tsproxy: upstream listCollections reply has no cursor"))
		return nil
	}
	cd, _ := cur.DocumentOK()
	if p.extra == nil {
		elems, _ := doc.Elements()
		p.extra = []bsoncore.Element{}
		for _, e := range elems {
			if k := e.Key(); k != "cursor" && k != "ok" {
				p.extra = append(p.extra, e)
			}
		}
	}
	batch, err := cd.LookupErr("firstBatch")
	if err != nil {
		batch, _ = cd.LookupErr("nextBatch")
	}
	if arr, ok := batch.ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, v := range vals {
			if d, ok := v.DocumentOK(); ok {
				if m := p.mapDoc(d); m != nil && (p.post == nil || p.post(m)) {
					p.docs = append(p.docs, m)
				}
			}
		}
	}
	id, _ := cd.Lookup("id").AsInt64OK()
	if id == 0 {
		return nil
	}
	coll := "$cmd.listCollections"
	if ns, ok := cd.Lookup("ns").StringValueOK(); ok && len(ns) > len(p.db)+1 {
		coll = ns[len(p.db)+1:]
	}
	return bsoncore.NewDocumentBuilder().AppendInt64("getMore", id).
		AppendString("collection", coll).AppendString("$db", p.db).Build()
}

// mapDoc shows a bucket collection of the events layout as its app's
// time-series collection (TimeseriesInfo) and hides the app collection's own upstream entry and
// the proxy's writer leases (nil).
func (p *ListCollectionsPlan) mapDoc(d bsoncore.Document) bsoncore.Document {
	name, _ := d.Lookup("name").StringValueOK()
	if p.byApp[name] != nil || name == rules.LeaseCollection {
		return nil
	}
	r := p.byBucket[name]
	if r == nil {
		r = partitionOwner(p.byApp, name)
	}
	if r == nil {
		// A staging collection (rewrite/stage) shows as its rule's
		// namespace, which may have no bucket collection yet.
		r = stageOwner(p.byApp, name)
	}
	if r == nil && strings.HasPrefix(name, rules.StagePrefix) {
		return nil // a dropped rule's leftovers: the proxy's, not the app's
	}
	if r == nil {
		return append(bsoncore.Document(nil), d...)
	}
	if p.shown[r] {
		return nil // a partitioned rule's second partition
	}
	if p.shown == nil {
		p.shown = map[*rules.Rule]bool{}
	}
	p.shown[r] = true
	if r.Layout == rules.LayoutEvents || r.Layout == "" {
		return TimeseriesInfo(r, p.nameOnly)
	}
	// The counter and slots layouts are not MongoDB's time series: their
	// bucket collection shows under the app's name.
	return bsonutil.ReplaceField(d, "name", func(dst []byte) []byte {
		return bsoncore.AppendStringElement(dst, "name", r.Collection)
	})
}

// Result is the reply for the client.
func (p *ListCollectionsPlan) Result() []byte {
	if p.errReply != nil {
		return p.errReply
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	cidx, c := bsoncore.AppendDocumentElementStart(out, "cursor")
	c = bsoncore.AppendInt64Element(c, "id", 0)
	c = bsoncore.AppendStringElement(c, "ns", p.db+".$cmd.listCollections")
	aidx, a := bsoncore.AppendArrayElementStart(c, "firstBatch")
	for i, d := range p.docs {
		a = bsoncore.AppendDocumentElement(a, strconv.Itoa(i), d)
	}
	c, _ = bsoncore.AppendArrayEnd(a, aidx)
	out, _ = bsoncore.AppendDocumentEnd(c, cidx)
	for _, e := range p.extra {
		out = append(out, e...)
	}
	out = bsoncore.AppendDoubleElement(out, "ok", 1)
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// partitionOwner is the partitioned rule (among byApp's) that coll is a
// partition of, or nil. listCollections shows a partitioned rule's
// partitions as the app's one collection.
func partitionOwner(byApp map[string]*rules.Rule, coll string) *rules.Rule {
	for _, r := range byApp {
		if _, ok := r.ParsePartition(coll); ok && r.Partitioned() {
			return r
		}
	}
	return nil
}

// stageOwner is the rule (among byApp's) whose staging tier coll belongs
// to, or nil.
func stageOwner(byApp map[string]*rules.Rule, coll string) *rules.Rule {
	for _, r := range byApp {
		if strings.HasPrefix(coll, r.StagePrefix()) {
			return r
		}
	}
	return nil
}
