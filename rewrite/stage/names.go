package stage

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bucket"
	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rules"
)

// Collection is one collection of a rule's staging tier.
type Collection struct {
	Name string
	// Window is the start (ms since the epoch) of the staging period
	// whose events it holds (rules.Rule.StagePeriod).
	Window int64
	// Owner is the tag of the proxy that inserts into it (Stager.Tag),
	// and Gen the generation of that proxy's collections it belongs to;
	// "" for a collection of the writer lease's holder (names from before
	// proxies staged into collections of their own, and late documents a
	// merge moved back).
	Owner string
	Gen   int64
	// Token orders retired collections (being merged); 0 for a staging
	// collection that still takes inserts.
	Token int64
	// TakenOver: retired by another proxy than its owner, which had
	// stopped: an insert the owner began may still land in it (see
	// MergeOptions.CheckLate).
	TakenOver bool
}

// Retired says whether the collection is frozen for a merge.
func (c Collection) Retired() bool { return c.Token != 0 }

// OwnedBy says whether c is a staging collection of the proxy tagged tag,
// of its run whose first generation is since.
func (c Collection) OwnedBy(tag string, since int64) bool {
	return c.Owner != "" && c.Owner == tag && c.Gen >= since
}

// OpenName is the name the collection had while it took inserts.
func (c Collection) OpenName() string {
	if !c.Retired() {
		return c.Name
	}
	infix := retiredInfix
	if c.TakenOver {
		infix = takenInfix
	}
	return c.Name[:strings.LastIndex(c.Name, infix)]
}

// Stager names the staging collections one proxy inserts into. Each
// proxy inserts only into collections of its own, and only it freezes
// them while it runs (holding its own inserts off), so that no insert of
// another proxy can be on its way into a collection being frozen:
// FerretDB's rename changes only its catalog, and such an insert would
// commit into the renamed collection after the merge read it. So staged
// inserts need no writer lease, and any number of proxies ingest a rule
// at once.
type Stager struct {
	// Tag names the proxy: 8 hex digits, the same across its restarts.
	// "" stages into the names of the writer lease's holder.
	Tag string
	// Gen is the generation of the proxy's collections: it changes at
	// every freeze of them, so that a collection frozen is never created
	// again under its name (a read waiting for a name to be merged would
	// wait for the next events too).
	Gen int64
}

// StagerTag is the tag of a proxy named id (its writer identity).
func StagerTag(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:4])
}

// OpenCollection is the staging collection stager inserts the events of
// the window starting at windowStart (ms) into.
func OpenCollection(rule *rules.Rule, windowStart int64, stager Stager) string {
	name := rule.StageCollection(windowStart)
	if stager.Tag == "" {
		return name
	}
	return name + ownerInfix + stager.Tag + "_" + strconv.FormatInt(stager.Gen, 10)
}

// Infixes of staging names: a proxy's own collection, one retired by its
// owner (or the lease holder), one retired by another proxy after its
// owner stopped.
const (
	ownerInfix   = "_p"
	retiredInfix = "_m"
	takenInfix   = "_k"
)

// RetiredName is the name a staging collection gets when a merge freezes
// it.
func RetiredName(stage string, token int64) string {
	return stage + retiredInfix + strconv.FormatInt(token, 10)
}

// TakenOverName is the name a staging collection of a stopped proxy gets
// when another freezes it.
func TakenOverName(stage string, token int64) string {
	return stage + takenInfix + strconv.FormatInt(token, 10)
}

// goneInfix names a retired collection whose table the upstream lost
// (LostName).
const goneInfix = "gone_"

// LostName is the name a retired collection whose table the upstream lost
// is moved to (Merge): in the staging tier's names, so hidden
// from clients and dropped with the rule's staging, but of no form Parse
// reads, so that no merge, read or flush meets it again.
func LostName(rule *rules.Rule, name string) string {
	return rule.StagePrefix() + goneInfix + strings.TrimPrefix(name, rule.StagePrefix())
}

// TxnsCollection holds the records of the retryable writes merged lately.
func TxnsCollection(rule *rules.Rule) string {
	return rule.StagePrefix() + "txns"
}

// Parse reads a collection name of rule's staging tier: a staging
// collection (<prefix><window>, or <prefix><window>_p<tag>_<gen> of one
// proxy) or a retired one (either, then _m<token> or _k<token>).
func Parse(rule *rules.Rule, name string) (Collection, bool) {
	rest, ok := strings.CutPrefix(name, rule.StagePrefix())
	if !ok {
		return Collection{}, false
	}
	c := Collection{Name: name}
	// The window may be before the epoch: a leading minus.
	sign := ""
	if strings.HasPrefix(rest, "-") {
		sign, rest = "-", rest[1:]
	}
	var w string
	w, rest = leadingDigits(rest)
	if c.Window, ok = Number(sign + w); !ok {
		return Collection{}, false
	}
	if tail, owned := strings.CutPrefix(rest, ownerInfix); owned {
		if len(tail) < 10 || tail[8] != '_' || !IsHex(tail[:8]) {
			return Collection{}, false
		}
		c.Owner = tail[:8]
		var g string
		g, rest = leadingDigits(tail[9:])
		if c.Gen, ok = Number(g); !ok {
			return Collection{}, false
		}
	}
	if rest == "" {
		return c, true
	}
	switch {
	case strings.HasPrefix(rest, retiredInfix):
	case strings.HasPrefix(rest, takenInfix):
		c.TakenOver = true
	default:
		return Collection{}, false
	}
	t, ok := Number(rest[len(retiredInfix):])
	if !ok || t <= 0 {
		return Collection{}, false
	}
	c.Token = t
	return c, true
}

// leadingDigits splits s after its leading decimal digits.
func leadingDigits(s string) (digits, rest string) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i], s[i:]
}

// Number reads a canonical decimal (no plus sign, no leading zero).
func Number(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && strconv.FormatInt(n, 10) == s
}

func IsHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// flushInfix names a flush request: a collection a proxy that cannot
// merge a rule (another holds its writer lease) creates, and the holder's
// background merger drops once it merged everything (see FlushMarker).
const flushInfix = "flush_"

// FlushMarker is the flush request collection with token (unique per
// request).
func FlushMarker(rule *rules.Rule, token string) string {
	return rule.StagePrefix() + flushInfix + token
}

// IsFlushMarker says whether name is one of rule's flush requests.
func IsFlushMarker(rule *rules.Rule, name string) bool {
	return strings.HasPrefix(name, rule.StagePrefix()+flushInfix)
}

// FlushRequestCommand creates flush request marker in rule's database.
func FlushRequestCommand(rule *rules.Rule, marker string) []byte {
	return bucket.CreateCommand(rule.DB, marker)
}

// FlushPendingCommand lists flush request marker (one document while it
// is pending, none once answered).
func FlushPendingCommand(rule *rules.Rule, marker string) []byte {
	return bsoncore.NewDocumentBuilder().AppendInt32("listCollections", 1).
		AppendDocument("filter", bsoncore.NewDocumentBuilder().AppendString("name", marker).Build()).
		AppendBoolean("nameOnly", true).AppendString("$db", rule.DB).Build()
}

// FlushPending reads FlushPendingCommand's reply.
func FlushPending(reply []byte) (bool, error) {
	docs, _, err := cursor.Docs(reply)
	return len(docs) > 0, err
}

// HasWork reads the reply to source.ListCommand of rule's database: true
// when it lists a staging collection of rule, a retired one or a flush
// request (or more names than its first batch holds). The background
// merger asks before it takes the rule's writer lease, so that an idle
// rule costs one listing a round and no write: a lease renewal would
// create a dropped database again.
func HasWork(rule *rules.Rule, reply []byte) (bool, error) {
	return anyListed(reply, func(name string) bool {
		_, ok := Parse(rule, name)
		return ok || IsFlushMarker(rule, name)
	})
}

// anyListed reads a listCollections reply: true when it lists a name
// that match says is one, or more names than its first batch holds.
func anyListed(reply []byte, match func(name string) bool) (bool, error) {
	docs, id, err := cursor.Docs(reply)
	if err != nil {
		return false, err
	}
	if id != 0 {
		return true, nil
	}
	for _, d := range docs {
		name, _ := d.Lookup("name").StringValueOK()
		if match(name) {
			return true, nil
		}
	}
	return false, nil
}

// WorkThrough reads the reply to source.ListCommand of rule's database:
// true when it lists a staging collection of rule, open or retired, that
// may hold an event at or before to (ms), or more names than its first
// batch holds. A staging collection's name carries the start of its
// staging period (rules.Rule.StageCollection), which no window of its
// events starts before, so one that starts after to holds no such event;
// and a merge of it writes, tops up or rewrites only buckets of those
// windows. So a read of events at or before to, on a rule whose staging
// holds only later periods, sees every acknowledged event it can match
// exactly once without a merge. Flush requests ask for merges of the
// collections they wait for, which the listing shows themselves.
func WorkThrough(rule *rules.Rule, reply []byte, to int64) (bool, error) {
	return anyListed(reply, func(name string) bool {
		c, ok := Parse(rule, name)
		return ok && c.Window <= to
	})
}

// OwnOpenOnly reads the reply to source.ListCommand of rule's database:
// ok when everything of rule's staging tier it lists is open and staged
// into by the proxy tagged tag since its generation since, with own
// those collections; not ok when it lists a retired collection, another
// proxy's or the lease holder's, a flush request, or more names than its
// first batch holds. The background merger skips a round whose listing
// is ok and whose own collections are not due: its merge would find only
// that, after listing again and freezing nothing with the rule's inserts
// held off.
func OwnOpenOnly(rule *rules.Rule, reply []byte, tag string, since int64) (own []Collection, ok bool, err error) {
	docs, id, err := cursor.Docs(reply)
	if err != nil || id != 0 {
		return nil, false, err
	}
	for _, d := range docs {
		name, _ := d.Lookup("name").StringValueOK()
		if IsFlushMarker(rule, name) {
			return nil, false, nil
		}
		c, parsed := Parse(rule, name)
		if !parsed {
			continue
		}
		if c.Retired() || !c.OwnedBy(tag, since) {
			return nil, false, nil
		}
		own = append(own, c)
	}
	return own, true, nil
}

// Remaining are those of waitFor (names of staging collections, open or
// retired, that a flush waits for) that listed still holds unmerged:
// under their name, or, for an open one, retired under a name of it.
func Remaining(rule *rules.Rule, listed, waitFor []string) []string {
	present := map[string]bool{}
	for _, name := range listed {
		present[name] = true
		if c, ok := Parse(rule, name); ok && c.Retired() {
			present[c.OpenName()] = true
		}
	}
	var out []string
	for _, name := range waitFor {
		if present[name] {
			out = append(out, name)
		}
	}
	return out
}

// FlushRequests are the flush requests a reply to source.ListCommand of
// rule's database lists (its first batch).
func FlushRequests(rule *rules.Rule, reply []byte) []string {
	docs, _, err := cursor.Docs(reply)
	if err != nil {
		return nil
	}
	var out []string
	for _, d := range docs {
		if name, _ := d.Lookup("name").StringValueOK(); IsFlushMarker(rule, name) {
			out = append(out, name)
		}
	}
	return out
}

// FlushRequestTime is when the flush request name was made (its token is
// an ObjectID); ok is false for a name of another form.
func FlushRequestTime(rule *rules.Rule, name string) (t time.Time, ok bool) {
	token, found := strings.CutPrefix(name, rule.StagePrefix()+flushInfix)
	if !found {
		return time.Time{}, false
	}
	id, err := bson.ObjectIDFromHex(token)
	if err != nil {
		return time.Time{}, false
	}
	return id.Timestamp(), true
}
