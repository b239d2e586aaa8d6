package wire

import (
	"encoding/binary"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"
)

// Query is a legacy OP_QUERY message, still sent by drivers for the first
// hello/isMaster of a connection. Query and ReturnFieldsSelector alias the
// decoded frame; ReturnFieldsSelector is nil when absent.
type Query struct {
	Flags                int32
	FullCollectionName   string
	NumberToSkip         int32
	NumberToReturn       int32
	Query                []byte
	ReturnFieldsSelector []byte
}

// Decode decodes a whole OP_QUERY frame (header included) into q. The query
// and the optional selector must be valid BSON and fill the frame exactly.
func (q *Query) Decode(frame []byte) error {
	*q = Query{}
	_, rest, err := checkFrame(frame, OpQuery)
	if err != nil {
		return err
	}
	if len(rest) < 4 {
		return malformed("OP_QUERY: message of %d bytes too short for flags", len(frame))
	}
	q.Flags = int32(binary.LittleEndian.Uint32(rest))
	name, rest, ok := wiremessage.ReadQueryFullCollectionName(rest[4:])
	if !ok {
		return malformed("OP_QUERY: fullCollectionName not NUL-terminated")
	}
	if name == "" {
		return malformed("OP_QUERY: empty fullCollectionName")
	}
	q.FullCollectionName = name
	if len(rest) < 8 {
		return malformed("OP_QUERY: truncated before numberToSkip/numberToReturn: %d bytes left", len(rest))
	}
	q.NumberToSkip = int32(binary.LittleEndian.Uint32(rest))
	q.NumberToReturn = int32(binary.LittleEndian.Uint32(rest[4:]))
	doc, rest, err := readDoc(rest[8:], "query")
	if err != nil {
		return fmt.Errorf("OP_QUERY: %w", err)
	}
	q.Query = doc
	if len(rest) > 0 {
		doc, rest, err = readDoc(rest, "returnFieldsSelector")
		if err != nil {
			return fmt.Errorf("OP_QUERY: %w", err)
		}
		q.ReturnFieldsSelector = doc
	}
	if len(rest) > 0 {
		return malformed("OP_QUERY: %d bytes after returnFieldsSelector", len(rest))
	}
	return nil
}

// Encode appends q as a whole OP_QUERY frame (see the package doc). An
// empty ReturnFieldsSelector is omitted.
func (q *Query) Encode(dst []byte, h Header) ([]byte, error) {
	if q.FullCollectionName == "" || strings.IndexByte(q.FullCollectionName, 0) >= 0 {
		return dst, malformed("OP_QUERY: invalid fullCollectionName %q", q.FullCollectionName)
	}
	if err := checkDocPrefix(q.Query, "query"); err != nil {
		return dst, fmt.Errorf("OP_QUERY: %w", err)
	}
	if len(q.ReturnFieldsSelector) > 0 {
		if err := checkDocPrefix(q.ReturnFieldsSelector, "returnFieldsSelector"); err != nil {
			return dst, fmt.Errorf("OP_QUERY: %w", err)
		}
	}
	start, dst := appendHeaderStart(dst, h, OpQuery)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(q.Flags))
	dst = append(dst, q.FullCollectionName...)
	dst = append(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(q.NumberToSkip))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(q.NumberToReturn))
	dst = append(dst, q.Query...)
	dst = append(dst, q.ReturnFieldsSelector...)
	dst, err := finishFrame(dst, start)
	if err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// CommandName returns the first key of the query document (for a command
// query on "<db>.$cmd", the command's name). A query wrapped in "$query"
// (or "query") is looked into.
func (q *Query) CommandName() string {
	k := firstKey(q.Query)
	if k == "$query" || k == "query" {
		if e, err := bsoncoreDoc(q.Query).LookupErr(k); err == nil {
			if d, ok := e.DocumentOK(); ok {
				return firstKey(d)
			}
		}
	}
	return k
}

// DB returns the database part of FullCollectionName.
func (q *Query) DB() string {
	db, _, _ := strings.Cut(q.FullCollectionName, ".")
	return db
}
