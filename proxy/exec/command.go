package exec

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
)

// The proxy's single commands and raw round trips go through here too,
// so that every upstream byte of the proxy has one way out.

// Commander runs a command the proxy itself builds (*upstream.Conn
// does).
type Commander interface {
	Command(cmd any) (bson.Raw, error)
}

// Command runs one command body on up, an upstream connection of the
// proxy's own, as a one-step plan, and returns its reply.
func Command(up *upstream.Conn, body []byte) (bson.Raw, error) {
	res, err := Drive(OnConn{Up: up}, rewrite.Passthrough(body, nil))
	return bson.Raw(res.Reply), err
}

// CommandDoc runs cmd, a document the proxy built, on up; the reply
// aliases up's buffer.
func CommandDoc(up Commander, cmd any) (bson.Raw, error) { return up.Command(cmd) }

// RoundTrip sends a client's frame on up as it is and returns the reply
// frame (passthrough).
func RoundTrip(up *upstream.Conn, frame []byte) (wire.Header, []byte, error) {
	return up.RoundTrip(frame)
}
