package point

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/tsproxy/tsproxy/rewrite/bsonutil"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/rewrite/query"
)

type shapeMode uint8

// CursorShape is how the batches of one rewritten read's cursor are turned
// into the app's: kept with the cursor so getMore batches come out as the
// first did.
type CursorShape struct {
	Ns        string
	MetaField string
	Mode      shapeMode
	Proj      *query.Projection
	GroupID   bsoncore.Value // shapeGroupCount: the $group _id
	GroupKey  string         // shapeGroupCount: the counted field
	Metas     *MetaResolver
	// SingleBatch: the app asked for one batch; the proxy kills the
	// upstream cursor after the first and answers with id 0.
	SingleBatch bool
}

// NS is the app's namespace, the cursor's ns in replies.
func (s *CursorShape) NS() string { return s.Ns }

// MetaQuery returns the upstream find of the metas the reply's unwound
// buckets lack (FerretDB's $unwind drops them), or nil when none is
// needed. The proxy sends it and gives the reply to AddMetas before
// MapReply.
func (s *CursorShape) MetaQuery(reply []byte) [][]byte {
	if s.Mode != ShapeEvent {
		return nil
	}
	return s.Metas.Query(reply)
}

// AddMetas learns the metas from the reply to MetaQuery.
func (s *CursorShape) AddMetas(reply []byte) error { return s.Metas.Add(reply) }

// MapReply maps an aggregate or getMore reply from the bucket collection
// to the app's: batches reshaped, ns the app's. It returns the upstream
// cursor id (0 when exhausted). An error reply comes back unchanged.
func (s *CursorShape) MapReply(reply []byte) ([]byte, int64, error) {
	doc := bsoncore.Document(reply)
	if err := doc.Validate(); err != nil {
		return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream reply is not valid BSON: %v", err)
	}
	if !mongoerr.IsOK(doc) {
		return reply, 0, nil
	}
	elems, _ := doc.Elements()
	var id int64
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(reply)))
	for _, e := range elems {
		if e.Key() != "cursor" {
			out = append(out, e...)
			continue
		}
		cur, ok := e.Value().DocumentOK()
		if !ok {
			return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream cursor is a %s", bsonutil.TypeName(e.Value().Type))
		}
		var err error
		out, id, err = s.appendCursor(out, cur)
		if err != nil {
			return nil, 0, err
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out, id, nil
}

func (s *CursorShape) appendCursor(dst []byte, cur bsoncore.Document) ([]byte, int64, error) {
	elems, err := cur.Elements()
	if err != nil {
		return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream cursor is not valid BSON: %v", err)
	}
	var id int64
	cidx, dst := bsoncore.AppendDocumentElementStart(dst, "cursor")
	for _, e := range elems {
		switch k := e.Key(); k {
		case "firstBatch", "nextBatch":
			arr, ok := e.Value().ArrayOK()
			if !ok {
				return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream %s is a %s", k, bsonutil.TypeName(e.Value().Type))
			}
			vals, err := arr.Values()
			if err != nil {
				return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream %s is not valid BSON: %v", k, err)
			}
			aidx, a := bsoncore.AppendArrayElementStart(dst, k)
			i := 0
			for _, v := range vals {
				d, ok := v.DocumentOK()
				if !ok {
					return nil, 0, mongoerr.Errorf(mongoerr.InternalError, "upstream %s holds a %s", k, bsonutil.TypeName(v.Type))
				}
				m, err := s.mapDoc(d)
				if err != nil {
					return nil, 0, err
				}
				a = bsoncore.AppendDocumentElement(a, bsonutil.Itoa(i), m)
				i++
			}
			dst, _ = bsoncore.AppendArrayEnd(a, aidx)
		case "id":
			id, _ = e.Value().AsInt64OK()
			out := id
			if s.SingleBatch {
				out = 0
			}
			dst = bsoncore.AppendInt64Element(dst, "id", out)
		case "ns":
			dst = bsoncore.AppendStringElement(dst, "ns", s.Ns)
		default:
			dst = append(dst, e...)
		}
	}
	dst, _ = bsoncore.AppendDocumentEnd(dst, cidx)
	return dst, id, nil
}

func (s *CursorShape) mapDoc(d bsoncore.Document) (bsoncore.Document, error) {
	switch s.Mode {
	case ShapeEvent:
		ev, err := ReshapeEvent(d, s.MetaField, s.Metas)
		if err != nil {
			return nil, err
		}
		return s.Proj.Apply(ev)
	case ShapeGroupCount:
		v, err := d.LookupErr("n")
		if err != nil {
			return nil, mongoerr.Errorf(mongoerr.InternalError, "upstream $count gave no n")
		}
		idx, out := bsoncore.AppendDocumentStart(nil)
		out = bsoncore.AppendValueElement(out, "_id", s.GroupID)
		out = bsoncore.AppendValueElement(out, s.GroupKey, v)
		return bsoncore.AppendDocumentEnd(out, idx)
	default:
		return d, nil
	}
}

const (
	ShapeEvent      shapeMode = iota // unwound bucket → event, then projection
	ShapeAsIs                        // documents the pipeline computed ($count, full aggregation)
	ShapeGroupCount                  // {n: N} from $count → {_id: C, n: N} as $group gave
)
