package read

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
	"github.com/tsproxy/tsproxy/rewrite/read/point"
)

// Reads on an upstream that cannot see the events (caps.Upstream.
// PackedEvents: FerretDB, whose buckets keep their events packed in one
// binary value) are all the proxy's own: no $unwind goes upstream.

// planFindScan plans a find on an upstream that cannot see the events
// (caps.Upstream.PackedEvents): point lookups of the buckets a series and
// time filter names, a time-range scan, or an event scan, every one
// filtered, sorted and projected by the proxy.
func planFindScan(rc *query.Ctx, filter, sortDoc bsoncore.Document, proj *query.Projection, pg query.Paging, opts Options) (*Command, error) {
	var pr *point.PointRead
	if spec, _ := point.PlanPoint(rc, filter, sortDoc); spec != nil {
		if spec, sc := pointOrScan(rc, spec, filter, sortDoc, opts); sc != nil {
			pr = point.NewScanRead(rc, spec, sc, proj, pg.Skip, pg.Limit, pg.Single)
		} else {
			pr = point.NewPointRead(rc, spec, proj, pg.Skip, pg.Limit, pg.Single)
		}
	} else if spec, sc, _ := point.PlanScan(rc, filter, sortDoc); spec != nil {
		pr = point.NewScanRead(rc, spec, sc, proj, pg.Skip, pg.Limit, pg.Single)
	} else {
		var err error
		if pr, err = scanOrRefuse(rc, "find", filter, sortDoc, proj, pg); err != nil {
			return nil, err
		}
	}
	pr.Want(pg.FirstBatch())
	return &Command{rc: rc, Point: pr}, nil
}

// scanOrRefuse is the event scan of a read on an upstream that cannot
// see the events, or the error naming what the proxy cannot evaluate.
// A malformed filter gets the server's error and code; what the proxy
// does not evaluate, a refusal naming it.
func scanOrRefuse(rc *query.Ctx, cmd string, filter, sortDoc bsoncore.Document, proj *query.Projection, pg query.Paging) (*point.PointRead, error) {
	spec, sc, err := point.PlanEventScan(rc, filter, sortDoc)
	var malformed *mongoerr.Error
	switch {
	case errors.As(err, &malformed):
		return nil, err
	case err != nil:
		return nil, rc.Unsupported("%s on a bucketed namespace on this upstream is evaluated by the proxy, which does not support it: %v", cmd, err)
	}
	return point.NewScanRead(rc, spec, sc, proj, pg.Skip, pg.Limit, pg.Single), nil
}
