package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// docName names a document in errors. It is formatted only when an error
// is built, so the success path allocates nothing.
type docName struct {
	what string // "body", "query", ...
	seq  string // or the identifier of the document sequence holding it
}

func (n docName) String() string {
	if n.seq != "" {
		return fmt.Sprintf("document sequence %q", n.seq)
	}
	return n.what
}

// readDoc reads one length-prefixed BSON document from the front of src,
// checks its length against MaxDocLen and validates it (structure, nesting
// depth, every element). what names the document in errors.
func readDoc(src []byte, what string) (doc, rem []byte, err error) {
	return readDocNamed(src, docName{what: what})
}

func readDocNamed(src []byte, what docName) (doc, rem []byte, err error) {
	if len(src) < 4 {
		return nil, src, malformed("truncated %s: %d bytes left, need at least 5", what, len(src))
	}
	n := int32(binary.LittleEndian.Uint32(src))
	if n < 5 {
		return nil, src, fmt.Errorf("%s: %w", what, &LimitError{What: "document length", Size: int64(n), Limit: 5, Min: true})
	}
	if n > MaxDocLen {
		return nil, src, fmt.Errorf("%s: %w", what, &LimitError{What: "document length", Size: int64(n), Limit: MaxDocLen})
	}
	d, rem, ok := bsoncore.ReadDocument(src)
	if !ok {
		return nil, src, malformed("truncated %s: document length %d but %d bytes left", what, n, len(src))
	}
	if err := ValidateDocument(d); err != nil {
		return nil, src, malformed("invalid BSON in %s: %w", what, err)
	}
	return d, rem, nil
}

// ValidateDocument validates a document whose length prefix equals len(d):
// the driver's Validate, then a walk of every element for what Validate
// does not check (nesting depth, strings ending in their NUL byte). Every
// document of a decoded message has passed it.
func ValidateDocument(d []byte) error {
	if err := bsoncore.Document(d).Validate(); err != nil {
		return err
	}
	return walkDoc(d, MaxDepth)
}

// walkDoc fails if d nests documents, arrays or code-with-scope scopes
// more than max levels deep, or holds a string (also JavaScript code,
// symbol, DBPointer) whose last byte is not the NUL the BSON spec requires:
// the driver's Validate accepts those, and servers drop the connection on
// them, or nests a document, array or scope that is not itself valid (the
// driver's Validate checks one level). It walks iteratively, so an
// adversarial document cannot exhaust the stack. d must already have
// passed Validate.
func walkDoc(d []byte, max int) error {
	stack := make([][]byte, 0, 16)
	stack = append(stack, d[4:len(d)-1])
	for len(stack) > 0 {
		top := len(stack) - 1
		if len(stack[top]) == 0 {
			stack = stack[:top]
			continue
		}
		elem, rem, ok := bsoncore.ReadElement(stack[top])
		if !ok {
			return errors.New("malformed element")
		}
		stack[top] = rem
		var inner []byte
		switch v := elem.Value(); v.Type {
		case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
			inner = v.Data
		case bsoncore.TypeCodeWithScope:
			if len(v.Data) < 8 || !nulTerminated(v.Data[4:]) {
				return fmt.Errorf("field %q: code string without its terminating NUL", elem.Key())
			}
			_, scope, ok := v.CodeWithScopeOK()
			if !ok {
				return fmt.Errorf("field %q: malformed code with scope", elem.Key())
			}
			inner = scope
		case bsoncore.TypeString, bsoncore.TypeJavaScript, bsoncore.TypeSymbol, bsoncore.TypeDBPointer:
			if !nulTerminated(v.Data) {
				return fmt.Errorf("field %q: string without its terminating NUL", elem.Key())
			}
		}
		if inner != nil {
			if len(stack) >= max {
				return fmt.Errorf("documents nested more than %d levels deep", max)
			}
			// Validate checks one level: its elements' types and lengths
			// and its terminator; the walk does the levels below.
			if err := bsoncore.Document(inner).Validate(); err != nil {
				return fmt.Errorf("field %q: %w", elem.Key(), err)
			}
			stack = append(stack, inner[4:len(inner)-1])
		}
	}
	return nil
}

// nulTerminated reports whether the length-prefixed string at the front of
// b has a NUL as its last byte.
func nulTerminated(b []byte) bool {
	if len(b) < 5 {
		return false
	}
	n := int(int32(binary.LittleEndian.Uint32(b)))
	return n >= 1 && 4+n <= len(b) && b[4+n-1] == 0
}

// firstKey returns the first key of a valid document, or "".
func firstKey(d []byte) string {
	if len(d) < 5 {
		return ""
	}
	e, err := bsoncore.Document(d).IndexErr(0)
	if err != nil {
		return ""
	}
	k, err := e.KeyErr()
	if err != nil {
		return ""
	}
	return k
}

// lookupString returns the string value of a top-level key of d.
func lookupString(d []byte, key string) (string, bool) {
	if len(d) < 5 {
		return "", false
	}
	v, err := bsoncore.Document(d).LookupErr(key)
	if err != nil {
		return "", false
	}
	return v.StringValueOK()
}

func bsoncoreDoc(d []byte) bsoncore.Document { return bsoncore.Document(d) }
