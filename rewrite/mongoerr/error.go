package mongoerr

import (
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Error is why a command is refused or cannot be run, with the code the
// client is answered with.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Errorf is an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf is the code of err: its *Error's, or InternalError.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return InternalError
}

// Reply is the command reply {ok: 0, errmsg, code, codeName} for err; an
// error that is not an *Error (a bug) is reported as InternalError.
func Reply(err error) bsoncore.Document {
	return ReplyWith(CodeOf(err), "", err.Error(), bsoncore.Value{})
}

// ReplyNamed is an error reply of code and msg named name (code's own
// name when empty).
func ReplyNamed(code Code, name, msg string) bsoncore.Document {
	return ReplyWith(code, name, msg, bsoncore.Value{})
}

// ReplyWith is an error reply of code and msg, named name (code's own name
// when empty: an upstream's reply keeps the name it gave), with labels (an
// array value, e.g. the upstream's errorLabels) when given.
func ReplyWith(code Code, name, msg string, labels bsoncore.Value) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder().
		AppendDouble("ok", 0).
		AppendString("errmsg", msg).
		AppendInt32("code", int32(code))
	if name == "" {
		name = code.Name()
	}
	if name != "" {
		b.AppendString("codeName", name)
	}
	if labels.Type == bsoncore.TypeArray {
		b.AppendArray("errorLabels", labels.Data)
	}
	return b.Build()
}

// FromReply is the error an upstream's error reply, or one of its
// writeErrors, names by its code and errmsg (InternalError and fallback
// where they are missing).
func FromReply(d bsoncore.Document, fallback string) *Error {
	e := &Error{Code: InternalError, Msg: fallback}
	if c, ok := d.Lookup("code").AsInt64OK(); ok {
		e.Code = Code(c)
	}
	if s, ok := d.Lookup("errmsg").StringValueOK(); ok {
		e.Msg = s
	}
	return e
}

// ReplyError is nil for an {ok: 1} reply and the reply's error otherwise
// (InternalError for a reply that is not a valid document).
func ReplyError(reply bsoncore.Document) error {
	if err := reply.Validate(); err != nil {
		return Errorf(InternalError, "upstream reply is not valid BSON: %v", err)
	}
	if IsOK(reply) {
		return nil
	}
	return FromReply(reply, "upstream error")
}

// HasWriteErrors says whether reply reports write errors.
func HasWriteErrors(reply bsoncore.Document) bool {
	_, err := reply.LookupErr("writeErrors")
	return err == nil
}

// IsOK says whether reply is a command's success ({ok: 1}).
func IsOK(reply []byte) bool {
	v, err := bsoncore.Document(reply).LookupErr("ok")
	if err != nil {
		return false
	}
	if b, isBool := v.BooleanOK(); isBool {
		return b // FerretDB 2.x answers dropIndexes with ok: true
	}
	f, ok := v.AsFloat64OK()
	return ok && f == 1
}

// DroppedUnderQuery says whether err is FerretDB on PostgreSQL failing a
// query because its collection was dropped while the query ran: its
// catalog still named the table when the query began, and PostgreSQL
// answers "relation ... does not exist" (SQLSTATE 42P01) as an
// InternalError. A read that meets it may be sent again: the drop has
// ended by then, and the read finds no collection (an empty result).
func DroppedUnderQuery(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == InternalError && strings.Contains(e.Msg, "(SQLSTATE 42P01)")
}

// DroppedUnderQueryReply is DroppedUnderQuery of reply's error (false for
// a success): the same answer also says that a collection's drop was cut
// between its two statements, leaving an entry without a table.
func DroppedUnderQueryReply(reply bsoncore.Document) bool {
	return !IsOK(reply) && DroppedUnderQuery(ReplyError(reply))
}
