package hello

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// helloTopologyFields are the fields of an upstream hello reply that would
// tell a driver about servers other than the proxy (or let it stream
// topology changes). Drivers that saw them would connect around the proxy.
var helloTopologyFields = map[string]bool{
	"hosts": true, "passives": true, "arbiters": true, "setName": true,
	"setVersion": true, "primary": true, "me": true, "topologyVersion": true,
	"secondary": true, "arbiterOnly": true, "passive": true, "hidden": true,
	"tags": true, "electionId": true, "lastWrite": true, "isreplicaset": true,
	"msg": true, "compression": true, "buildIndexes": true,
}

// HelloRequest prepares a client's hello/isMaster for the upstream: it
// returns the command without its "compression" offer (the proxy negotiates
// compression with the client itself; the upstream link stays plain) and
// the compressors the client offered, in its order of preference.
func Request(body bsoncore.Document) (bsoncore.Document, []string, error) {
	elems, err := body.Elements()
	if err != nil {
		return nil, nil, fmt.Errorf("rewrite hello: %w", err)
	}
	var offers []string
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() == "compression" {
			if arr, ok := e.Value().ArrayOK(); ok {
				vals, _ := arr.Values()
				for _, v := range vals {
					if s, ok := v.StringValueOK(); ok {
						offers = append(offers, s)
					}
				}
			}
			continue
		}
		out = append(out, e...)
	}
	out, err = bsoncore.AppendDocumentEnd(out, idx)
	if err != nil {
		return nil, nil, fmt.Errorf("rewrite hello: %w", err)
	}
	return out, offers, nil
}

// HelloReply turns the upstream's hello reply into the proxy's: a router
// (msg "isdbgrid") with no trace of the upstream's topology, keeping its
// wire versions, size limits, session timeout, SASL mechanisms and
// speculative authentication reply. compressor, when not empty, is the
// compressor the proxy accepts from this client.
func Reply(reply bsoncore.Document, compressor string) (bsoncore.Document, error) {
	elems, err := reply.Elements()
	if err != nil {
		return nil, fmt.Errorf("rewrite hello reply: %w", err)
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	ok := false
	for _, e := range elems {
		k := e.Key()
		if helloTopologyFields[k] {
			continue
		}
		if k == "ok" {
			ok = true
		}
		out = append(out, e...)
	}
	// Only a successful hello describes a server; an error reply passes
	// through with the topology fields removed and nothing added.
	if ok && helloReplyOK(reply) {
		out = bsoncore.AppendStringElement(out, "msg", "isdbgrid")
		if compressor != "" {
			aidx, o := bsoncore.AppendArrayElementStart(out, "compression")
			o = bsoncore.AppendStringElement(o, "0", compressor)
			out, _ = bsoncore.AppendArrayEnd(o, aidx)
		}
	}
	return bsoncore.AppendDocumentEnd(out, idx)
}

// RouterHelloLimits are the values a synthetic hello reports; the proxy
// fills them from the last hello it saw from the upstream.
type RouterHelloLimits struct {
	MinWireVersion, MaxWireVersion int32
	MaxBSONObjectSize              int32
	MaxMessageSizeBytes            int32
	MaxWriteBatchSize              int32
	LogicalSessionTimeoutMinutes   int32
}

// RouterHello is the hello reply the proxy gives when the upstream cannot
// be reached: it keeps drivers' server selection succeeding, so that the
// commands that follow fail at once with a clear upstream error instead of
// every operation waiting out the driver's server selection timeout.
// legacy selects the isMaster field name ("ismaster") over hello's.
func RouterHello(legacy bool, l RouterHelloLimits, nowMillis int64, compressor string) bsoncore.Document {
	idx, out := bsoncore.AppendDocumentStart(nil)
	if legacy {
		out = bsoncore.AppendBooleanElement(out, "ismaster", true)
	} else {
		out = bsoncore.AppendBooleanElement(out, "isWritablePrimary", true)
	}
	out = bsoncore.AppendStringElement(out, "msg", "isdbgrid")
	out = bsoncore.AppendInt32Element(out, "maxBsonObjectSize", l.MaxBSONObjectSize)
	out = bsoncore.AppendInt32Element(out, "maxMessageSizeBytes", l.MaxMessageSizeBytes)
	out = bsoncore.AppendInt32Element(out, "maxWriteBatchSize", l.MaxWriteBatchSize)
	out = bsoncore.AppendDateTimeElement(out, "localTime", nowMillis)
	out = bsoncore.AppendInt32Element(out, "logicalSessionTimeoutMinutes", l.LogicalSessionTimeoutMinutes)
	out = bsoncore.AppendInt32Element(out, "minWireVersion", l.MinWireVersion)
	out = bsoncore.AppendInt32Element(out, "maxWireVersion", l.MaxWireVersion)
	if compressor != "" {
		aidx, o := bsoncore.AppendArrayElementStart(out, "compression")
		o = bsoncore.AppendStringElement(o, "0", compressor)
		out, _ = bsoncore.AppendArrayEnd(o, aidx)
	}
	out = bsoncore.AppendDoubleElement(out, "ok", 1)
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// helloReplyOK reports whether a reply's "ok" is true-ish (1, 1.0, true).
func helloReplyOK(reply bsoncore.Document) bool {
	v, err := reply.LookupErr("ok")
	if err != nil {
		return false
	}
	switch v.Type {
	case bsoncore.TypeDouble:
		return v.Double() == 1
	case bsoncore.TypeInt32:
		return v.Int32() == 1
	case bsoncore.TypeInt64:
		return v.Int64() == 1
	case bsoncore.TypeBoolean:
		return v.Boolean()
	}
	return false
}
