package admin

import (
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/internal/rwtest"
)

// TestDropStaging: every collection of the rule's staging tier is
// dropped; a drop refused fails the plan, naming the collection, but not
// one of a collection whose table FerretDB on PostgreSQL lost (it holds
// nothing, and FerretDB can never drop it).
func TestDropStaging(t *testing.T) {
	rule := rwtest.Rule()
	staged, lost := rule.StagePrefix()+"txns", rule.StagePrefix()+"gone_1_m2"
	listing := rwtest.CursorReply(t, 0, bson.D{{Key: "name", Value: staged}}, bson.D{{Key: "name", Value: lost}}, bson.D{{Key: "name", Value: "other"}})
	okReply := rwtest.Doc(t, bson.D{{Key: "ok", Value: 1.0}})
	lostReply := rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 1}, {Key: "errmsg", Value: `ERROR: relation "db.t_1" does not exist (SQLSTATE 42P01)`}})
	refused := rwtest.Doc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: 13}, {Key: "errmsg", Value: "not authorized"}})
	cases := []struct {
		name    string
		replies map[string][]byte // by collection dropped
		wantErr string
	}{
		{"all dropped", map[string][]byte{staged: okReply, lost: okReply}, ""},
		{"a lost table", map[string][]byte{staged: okReply, lost: lostReply}, ""},
		{"a drop refused", map[string][]byte{staged: refused, lost: lostReply}, staged},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := DropStaging(rule)
			var dropped []string
			for range 10 {
				step, done := p.Next()
				if done {
					break
				}
				replies := make([][]byte, len(step))
				for i, u := range step {
					first, _ := bsoncore.Document(u.Body).IndexErr(0)
					switch first.Key() {
					case "listCollections":
						replies[i] = listing
					case "drop":
						coll := first.Value().StringValue()
						dropped = append(dropped, coll)
						replies[i] = c.replies[coll]
					default:
						t.Fatalf("unexpected command %s", first.Key())
					}
				}
				if err := p.Feed(replies); err != nil {
					if c.wantErr == "" || !strings.Contains(err.Error(), c.wantErr) {
						t.Fatalf("error %v, want one naming %q", err, c.wantErr)
					}
					return
				}
			}
			res := p.Result()
			errmsg, _ := bsoncore.Document(res.Reply).Lookup("errmsg").StringValueOK()
			if res.Reply != nil && errmsg == "" {
				errmsg = "a reply without errmsg: " + bson.Raw(res.Reply).String()
			}
			if (errmsg != "") != (c.wantErr != "") || !strings.Contains(errmsg, c.wantErr) {
				t.Fatalf("error %q, want one naming %q", errmsg, c.wantErr)
			}
			if !slices.Equal(dropped, []string{staged, lost}) {
				t.Errorf("dropped %v, want the staging tier's %v", dropped, []string{staged, lost})
			}
		})
	}
}
