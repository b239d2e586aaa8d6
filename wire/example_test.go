package wire_test

import (
	"bytes"
	"fmt"

	"github.com/tsproxy/tsproxy/wire"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// A proxy's read loop: frame, decompress, decode, inspect, forward.
func Example() {
	body, _ := bson.Marshal(bson.D{{Key: "find", Value: "events"}, {Key: "$db", Value: "metrics"}})
	in := wire.AppendMsg(nil, 42, 0, wire.ExhaustAllowed, body)
	in, _ = wire.Compress(in, wire.CompressorSnappy)

	conn := bytes.NewReader(in)
	var buf []byte
	for {
		h, frame, err := wire.ReadMessage(conn, buf, 0)
		if err != nil {
			break // io.EOF: clean close; errors.Is(err, wire.ErrMalformed): bad input
		}
		buf = frame[:0] // reuse the buffer; frame is valid until the next read
		if h.OpCode == wire.OpCompressed {
			if frame, err = wire.Decompress(frame); err != nil {
				fmt.Println(err)
				return
			}
		}
		var m wire.Msg
		if err := m.Decode(frame); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(h.RequestID, m.CommandName(), m.DB(), bson.Raw(m.Body).Lookup("find").StringValue())
		frame, _ = wire.SetMsgFlags(frame, m.Flags&^wire.ExhaustAllowed)
		fmt.Println(len(frame))
	}
	// Output:
	// 42 find metrics events
	// 60
}
