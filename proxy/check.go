package proxy

import (
	"context"

	"github.com/tsproxy/tsproxy/proxy/exec"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// CheckRules reports, at start, rules whose namespace already holds plain
// documents: the proxy will not read them (reads go to the buckets), and
// mixing the two silently would hide data. It needs an upstream that lets
// the proxy count without credentials; otherwise it says it could not check.
func (s *Server) CheckRules(ctx context.Context) {
	if s.opts.Rules.Len() == 0 {
		return
	}
	up, err := s.opts.Dialer.Dial(ctx)
	if err != nil {
		s.log.Warn("could not check the rules' namespaces for plain documents: upstream unreachable", "err", err.Error())
		return
	}
	defer up.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = up.SetDeadline(dl)
	}
	for _, r := range s.opts.Rules.All() {
		reply, err := exec.RunDoc(up, bson.D{{Key: "count", Value: r.Collection}, {Key: "$db", Value: r.DB}})
		if err != nil {
			s.log.Warn("could not check rule namespace for plain documents", "rule", r.Namespace, "err", err.Error())
			return
		}
		if !mongoerr.IsOK(reply) {
			s.log.Warn("could not check rule namespace for plain documents", "rule", r.Namespace, "err", reply.Lookup("errmsg").StringValue())
			continue
		}
		if n, _ := reply.Lookup("n").AsInt64OK(); n > 0 {
			s.log.Warn("rule namespace already holds plain documents; the proxy reads and writes buckets only, so these stay invisible through it. Move them with a backfill or drop them",
				"rule", r.Namespace, "plainDocuments", n, "bucketCollection", r.BucketNamespace())
		}
	}
}
