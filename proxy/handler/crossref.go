package handler

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/crossref"
	"github.com/tsproxy/tsproxy/rules"
)

// crossRefRule is a rule whose namespace req names besides its own target,
// and what names it (rewrite/crossref).
func (c *Conn) crossRefRule(req *request) (*rules.Rule, string) {
	var nsInfo [][]byte
	if req.name == "bulkWrite" {
		for _, seq := range req.msg.Sequences {
			if seq.Identifier == "nsInfo" {
				nsInfo = append(nsInfo, seq.Documents...)
			}
		}
	}
	return crossref.Find(c.rules, req.name, req.db, bson.Raw(req.msg.Body), nsInfo)
}
