package exec

import (
	"fmt"

	"github.com/tsproxy/tsproxy/rewrite"
	"github.com/tsproxy/tsproxy/rewrite/mongoerr"
	"github.com/tsproxy/tsproxy/upstream"
	"github.com/tsproxy/tsproxy/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Runner sends one plan step upstream and returns copies of the
// replies' bodies, in order. A connection runs steps on its client's
// upstream connection; the tests script one.
type Runner interface {
	RunStep(step rewrite.Step) ([][]byte, error)
}

// Drive runs a plan to its end. The error is the upstream connection's
// (the client connection then closes, as its session lived there); a plan
// that fails answers with an error reply in its result instead.
func Drive(r Runner, p rewrite.Plan) (rewrite.Result, error) {
	for {
		step, done := p.Next()
		if done {
			return p.Result(), nil
		}
		if len(step) == 0 {
			return rewrite.Result{}, fmt.Errorf("tsproxy: a plan asked for an empty step")
		}
		replies, err := r.RunStep(step)
		if err != nil {
			if rel, ok := p.(rewrite.Releaser); ok {
				rel.Release()
			}
			return rewrite.Result{}, err
		}
		if err := p.Feed(replies); err != nil {
			return rewrite.Result{Reply: mongoerr.Reply(err)}, nil
		}
	}
}

// OnConn runs steps on an upstream connection of the proxy's own (the
// sweeper's): its commands are deletes and reads, which hold no write
// slot.
type OnConn struct{ Up *upstream.Conn }

func (r OnConn) RunStep(step rewrite.Step) ([][]byte, error) {
	var buf []byte
	return Pipeline(r.Up, &buf, step)
}

// Pipeline sends a step's commands together on up and reads their
// replies in order (the upstream answers one connection's requests in
// order, so only round trips are saved); buf is reused for the frames.
func Pipeline(up *upstream.Conn, buf *[]byte, step rewrite.Step) ([][]byte, error) {
	b := (*buf)[:0]
	for _, u := range step {
		var err error
		if b, err = AppendFrame(b, u); err != nil {
			return nil, err
		}
	}
	*buf = b[:0]
	if err := up.Write(b); err != nil {
		return nil, err
	}
	out := make([][]byte, len(step))
	for i := range step {
		_, rf, err := up.ReadMessage()
		if err != nil {
			return nil, err
		}
		var m wire.Msg
		if err := m.Decode(rf); err != nil {
			return nil, fmt.Errorf("upstream reply: %w", err)
		}
		out[i] = append([]byte(nil), m.Body...)
	}
	return out, nil
}

// AppendFrame appends u as an OP_MSG: its body, and its document
// sequence when it has one.
func AppendFrame(dst []byte, u rewrite.Upstream) ([]byte, error) {
	if u.Seq == nil {
		return wire.AppendMsg(dst, upstream.NextRequestID(), 0, 0, u.Body), nil
	}
	seq := wire.Sequence{Identifier: u.Seq.Identifier, Documents: make([][]byte, len(u.Seq.Documents))}
	for i, d := range u.Seq.Documents {
		seq.Documents[i] = d
	}
	m := wire.Msg{Body: u.Body, Sequences: []wire.Sequence{seq}}
	frame, err := m.Encode(dst, wire.Header{RequestID: upstream.NextRequestID()})
	if err != nil {
		return nil, fmt.Errorf("encode upstream command: %w", err)
	}
	return frame, nil
}

// The proxy's single commands and raw round trips go through here too,
// so that every upstream byte of the proxy has one way out.

// Commander runs a command the proxy itself builds (*upstream.Conn
// does).
type Commander interface {
	Command(cmd any) (bson.Raw, error)
}

// Run runs one command body on up, an upstream connection of the
// proxy's own, as a one-step plan, and returns its reply.
func Run(up *upstream.Conn, body []byte) (bson.Raw, error) {
	res, err := Drive(OnConn{Up: up}, rewrite.Passthrough(body, nil))
	return bson.Raw(res.Reply), err
}

// RunDoc runs cmd, a document the proxy built, on up; the reply
// aliases up's buffer.
func RunDoc(up Commander, cmd any) (bson.Raw, error) { return up.Command(cmd) }

// Forward sends a client's frame on up as it is and returns the reply
// frame (passthrough).
func Forward(up *upstream.Conn, frame []byte) (wire.Header, []byte, error) {
	return up.RoundTrip(frame)
}
