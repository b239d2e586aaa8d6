package handler

import (
	"errors"

	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/wire"
)

// decodeErrorCode is the code and name MongoDB answers a message with that
// fails to decode as err does: a document over the BSON size limit is
// BSONObjectTooLarge there (as a plain collection reports it), anything
// else InvalidBSON.
func decodeErrorCode(err error) mongoerr.Code {
	var le *wire.LimitError
	if errors.As(err, &le) && le.What == "document length" && !le.Min {
		return mongoerr.BSONObjectTooLarge
	}
	return mongoerr.InvalidBSON
}
