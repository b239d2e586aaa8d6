package upstream

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
)

// Refusal is the upstream's error reply ({ok: 0}) to a command the proxy
// sent itself (a bucket fill load, a lease, a sweep). The proxy answers a
// client's command that needed it with the upstream's code, rather than a
// closed connection: an unauthenticated client must see the upstream's
// Unauthorized error, as it would without the proxy; a closed connection
// would make its driver retry the write without end.
type Refusal struct {
	Code     mongoerr.Code
	CodeName string
	Msg      string
}

func (e *Refusal) Error() string { return e.Msg }

// RefusalOf returns the refusal in an {ok: 0} reply, or nil when the reply
// is not one.
func RefusalOf(reply bson.Raw) *Refusal {
	if mongoerr.IsOK(reply) {
		return nil
	}
	r := &Refusal{Code: mongoerr.UnknownError, CodeName: mongoerr.UnknownError.Name()}
	if code, ok := reply.Lookup("code").AsInt64OK(); ok {
		r.Code = mongoerr.Code(code)
	}
	if name, ok := reply.Lookup("codeName").StringValueOK(); ok {
		r.CodeName = name
	}
	r.Msg, _ = reply.Lookup("errmsg").StringValueOK()
	if r.Msg == "" {
		r.Msg = fmt.Sprintf("upstream refused the command (code %d)", r.Code)
	}
	return r
}

// CommandError is nil for an {ok: 1} reply and the upstream's refusal
// otherwise.
func CommandError(reply bson.Raw) error {
	if r := RefusalOf(reply); r != nil {
		return r
	}
	return nil
}

// IsCode says whether err is an upstream refusal with code.
func IsCode(err error, code mongoerr.Code) bool {
	var r *Refusal
	return errors.As(err, &r) && r.Code == code
}
