package wire

import (
	"errors"
	"fmt"
)

// ErrMalformed is matched (errors.Is) by every error this package returns
// for input that breaks the wire protocol, including *LimitError.
var ErrMalformed = errors.New("malformed wire message")

// malformed returns an error that matches ErrMalformed and reads like
// fmt.Sprintf(format, args...). A %w verb in format is honoured.
func malformed(format string, args ...any) error {
	return &malformedError{err: fmt.Errorf(format, args...)}
}

type malformedError struct{ err error }

func (e *malformedError) Error() string        { return e.err.Error() }
func (e *malformedError) Unwrap() error        { return e.err }
func (e *malformedError) Is(target error) bool { return target == ErrMalformed }

// LimitError reports a size that exceeds (or falls below) a limit, found
// before anything of that size was allocated. It matches ErrMalformed.
type LimitError struct {
	What  string // e.g. "message length", "uncompressed size", "document length"
	Size  int64  // the size found
	Limit int64  // the limit it broke
	Min   bool   // true if Size is below the minimum Limit, false if above the maximum
}

func (e *LimitError) Error() string {
	if e.Min {
		return fmt.Sprintf("%s %d below minimum %d", e.What, e.Size, e.Limit)
	}
	return fmt.Sprintf("%s %d exceeds maximum %d", e.What, e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrMalformed) true for limit errors.
func (e *LimitError) Is(target error) bool { return target == ErrMalformed }
