package updates

import (
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// reply is the app's update reply, as a plain collection's: {n,
// nModified, upserted?, writeErrors?, writeConcernError?, ok: 1}.
func (r *Request) reply(out outcome) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt32Element(d, "n", int32(out.n))
	d = bsoncore.AppendInt32Element(d, "nModified", int32(out.modified))
	if len(out.upserted) > 0 {
		aidx, a := bsoncore.AppendArrayElementStart(d, "upserted")
		for i, up := range out.upserted {
			sidx, s := bsoncore.AppendDocumentElementStart(a, strconv.Itoa(i))
			s = bsoncore.AppendInt32Element(s, "index", int32(up.index))
			s = bsoncore.AppendValueElement(s, "_id", up.id)
			a, _ = bsoncore.AppendDocumentEnd(s, sidx)
		}
		d, _ = bsoncore.AppendArrayEnd(a, aidx)
	}
	if len(out.errs) > 0 {
		aidx, a := bsoncore.AppendArrayElementStart(d, "writeErrors")
		for i, e := range out.errs {
			code := mongoerr.CodeOf(e.Err)
			if code == 0 {
				code = mongoerr.InternalError
			}
			sidx, s := bsoncore.AppendDocumentElementStart(a, strconv.Itoa(i))
			s = bsoncore.AppendInt32Element(s, "index", int32(e.Index))
			s = bsoncore.AppendInt32Element(s, "code", int32(code))
			s = bsoncore.AppendStringElement(s, "errmsg", e.Err.Error())
			a, _ = bsoncore.AppendDocumentEnd(s, sidx)
		}
		d, _ = bsoncore.AppendArrayEnd(a, aidx)
	}
	if wce := r.find.WriteConcernError(); wce.Type != 0 {
		d = bsoncore.AppendValueElement(d, "writeConcernError", wce)
	}
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}
