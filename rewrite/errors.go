package rewrite

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MongoDB error codes the rewrite reports itself.
const (
	CodeInternalError      int32 = 1
	CodeBadValue           int32 = 2
	CodeHostUnreachable    int32 = 6
	CodeTypeMismatch       int32 = 14
	CodeInvalidLength      int32 = 16
	CodeInvalidBSON        int32 = 22
	CodeBSONObjectTooLarge int32 = 10334
	CodeDuplicateKey       int32 = 11000
	CodeNoBucketBranch     int32 = 40066 // $bucket: an input outside the boundaries, no default
)

var codeNames = map[int32]string{
	CodeInternalError:      "InternalError",
	CodeBadValue:           "BadValue",
	CodeHostUnreachable:    "HostUnreachable",
	CodeTypeMismatch:       "TypeMismatch",
	CodeInvalidLength:      "InvalidLength",
	CodeInvalidBSON:        "InvalidBSON",
	CodeBSONObjectTooLarge: "BSONObjectTooLarge",
	CodeDuplicateKey:       "DuplicateKey",
	CodeNoBucketBranch:     "Location40066",
}

// CommandError is why a whole command cannot be rewritten (it is not a
// well-formed insert, or the rule cannot be applied). It carries the
// MongoDB code the proxy should answer with.
type CommandError struct {
	Code int32
	Msg  string
}

func (e *CommandError) Error() string { return e.Msg }

// CodeName is MongoDB's name for e.Code.
func (e *CommandError) CodeName() string { return codeName(e.Code) }

func codeName(code int32) string {
	if n, ok := codeNames[code]; ok {
		return n
	}
	return ""
}

func commandErrorf(code int32, format string, args ...any) error {
	return &CommandError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// ErrorReply is the reply the proxy sends for an error returned by a
// rewrite function: {ok: 0, errmsg, code, codeName}. Errors that are not
// a *CommandError (there should be none) are reported as InternalError.
func ErrorReply(err error) bsoncore.Document {
	code := CodeInternalError
	var ce *CommandError
	if errors.As(err, &ce) {
		code = ce.Code
	}
	return commandErrorReply(code, codeName(code), err.Error(), bsoncore.Value{})
}

func commandErrorReply(code int32, name, msg string, labels bsoncore.Value) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder().
		AppendDouble("ok", 0).
		AppendString("errmsg", msg).
		AppendInt32("code", code)
	if name != "" {
		b.AppendString("codeName", name)
	}
	if labels.Type == bsoncore.TypeArray {
		b.AppendArray("errorLabels", labels.Data)
	}
	return b.Build()
}

// writeError is one entry of a reply's writeErrors: index is the position
// of the event in the app's own batch.
type writeError struct {
	index  int
	code   int32
	errmsg string
}

// typeName is MongoDB's alias for a BSON type, as $type and error
// messages spell it.
func typeName(t bsoncore.Type) string {
	switch t {
	case bsoncore.TypeDouble:
		return "double"
	case bsoncore.TypeString:
		return "string"
	case bsoncore.TypeEmbeddedDocument:
		return "object"
	case bsoncore.TypeArray:
		return "array"
	case bsoncore.TypeBinary:
		return "binData"
	case bsoncore.TypeUndefined:
		return "undefined"
	case bsoncore.TypeObjectID:
		return "objectId"
	case bsoncore.TypeBoolean:
		return "bool"
	case bsoncore.TypeDateTime:
		return "date"
	case bsoncore.TypeNull:
		return "null"
	case bsoncore.TypeRegex:
		return "regex"
	case bsoncore.TypeDBPointer:
		return "dbPointer"
	case bsoncore.TypeJavaScript:
		return "javascript"
	case bsoncore.TypeSymbol:
		return "symbol"
	case bsoncore.TypeCodeWithScope:
		return "javascriptWithScope"
	case bsoncore.TypeInt32:
		return "int"
	case bsoncore.TypeTimestamp:
		return "timestamp"
	case bsoncore.TypeInt64:
		return "long"
	case bsoncore.TypeDecimal128:
		return "decimal"
	case bsoncore.TypeMinKey:
		return "minKey"
	case bsoncore.TypeMaxKey:
		return "maxKey"
	}
	return fmt.Sprintf("type 0x%02x", byte(t))
}
