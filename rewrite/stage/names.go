package stage

import (
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/cursor"
	"github.com/tsproxy/tsproxy/rules"
)

// Collection is one collection of a rule's staging tier.
type Collection struct {
	Name string
	// Window is the start (ms since the epoch) of the staging period
	// whose events it holds (rules.Rule.StagePeriod).
	Window int64
	// Token orders retired collections (being merged); 0 for a staging
	// collection that still takes inserts.
	Token int64
}

// Retired says whether the collection is frozen for a merge.
func (c Collection) Retired() bool { return c.Token != 0 }

// retiredInfix joins a staging collection's name and a merge token.
const retiredInfix = "_m"

// RetiredName is the name a staging collection gets when a merge freezes
// it.
func RetiredName(stage string, token int64) string {
	return stage + retiredInfix + strconv.FormatInt(token, 10)
}

// TxnsCollection holds the records of the retryable writes merged lately.
func TxnsCollection(rule *rules.Rule) string {
	return rule.StagePrefix() + "txns"
}

// Parse reads a collection name of rule's staging tier: a staging
// collection (<bucket>.stage.<window>) or a retired one
// (<bucket>.stage.<window>.m<token>).
func Parse(rule *rules.Rule, name string) (Collection, bool) {
	rest, ok := strings.CutPrefix(name, rule.StagePrefix())
	if !ok {
		return Collection{}, false
	}
	win, tok, retired := strings.Cut(rest, retiredInfix)
	w, err := strconv.ParseInt(win, 10, 64)
	if err != nil || strconv.FormatInt(w, 10) != win {
		return Collection{}, false
	}
	c := Collection{Name: name, Window: w}
	if retired {
		t, err := strconv.ParseInt(tok, 10, 64)
		if err != nil || t <= 0 || strconv.FormatInt(t, 10) != tok {
			return Collection{}, false
		}
		c.Token = t
	}
	return c, true
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
	return bsoncore.NewDocumentBuilder().AppendString("create", marker).AppendString("$db", rule.DB).Build()
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
	docs, id, err := cursor.Docs(reply)
	if err != nil {
		return false, err
	}
	if id != 0 {
		return true, nil
	}
	for _, d := range docs {
		name, _ := d.Lookup("name").StringValueOK()
		if _, ok := Parse(rule, name); ok || IsFlushMarker(rule, name) {
			return true, nil
		}
	}
	return false, nil
}
