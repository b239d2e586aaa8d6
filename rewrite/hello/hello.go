package hello

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// helloTopologyFields are the fields of an upstream hello reply that would
// tell a driver about servers other than the proxy (or let it stream
// topology changes). Drivers that saw them would connect around the proxy.
var helloTopologyFields = map[string]bool{
	"hosts": true, "passives": true, "serviceId": true, "arbiters": true, "setName": true,
	"setVersion": true, "primary": true, "me": true, "topologyVersion": true,
	"secondary": true, "arbiterOnly": true, "passive": true, "hidden": true,
	"tags": true, "electionId": true, "lastWrite": true, "isreplicaset": true,
	"msg": true, "compression": true, "buildIndexes": true,
}

// Handshake is a client's hello/isMaster as the proxy reads it.
type Handshake struct {
	// Body is the command for the upstream: the client's, without its
	// "compression" offer (the proxy negotiates compression with the
	// client itself; the upstream link stays plain) and without
	// "loadBalanced" (the proxy is the service behind the client's load
	// balancer, not the upstream: a mongos not set up for one refuses it).
	Body bsoncore.Document
	// Compressors are the compressors the client offered, in its order
	// of preference.
	Compressors []string
	// LoadBalanced: the client's driver runs in load-balanced mode
	// (loadBalanced=true in its connection string) and needs a serviceId
	// in the reply.
	LoadBalanced bool
}

// Request reads a client's hello/isMaster.
func Request(body bsoncore.Document) (Handshake, error) {
	elems, err := body.Elements()
	if err != nil {
		return Handshake{}, fmt.Errorf("rewrite hello: %w", err)
	}
	var hs Handshake
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		switch e.Key() {
		case "compression":
			if arr, ok := e.Value().ArrayOK(); ok {
				vals, _ := arr.Values()
				for _, v := range vals {
					if s, ok := v.StringValueOK(); ok {
						hs.Compressors = append(hs.Compressors, s)
					}
				}
			}
			continue
		case "loadBalanced":
			hs.LoadBalanced, _ = e.Value().BooleanOK()
			continue
		}
		out = append(out, e...)
	}
	out, err = bsoncore.AppendDocumentEnd(out, idx)
	if err != nil {
		return Handshake{}, fmt.Errorf("rewrite hello: %w", err)
	}
	hs.Body = out
	return hs, nil
}

// ReplyOptions is what the proxy adds to a hello reply of its own.
type ReplyOptions struct {
	// Compressor, when not empty, is the compressor the proxy accepts
	// from this client.
	Compressor string
	// ServiceID, when set, is answered as serviceId: the identity of this
	// proxy behind a load balancer (a driver in load-balanced mode
	// requires it, and clears its pool of that service's connections on
	// some errors).
	ServiceID *bson.ObjectID
}

// appendTo adds the options' fields to a reply under construction.
func (o ReplyOptions) appendTo(out []byte) []byte {
	if o.Compressor != "" {
		aidx, a := bsoncore.AppendArrayElementStart(out, "compression")
		a = bsoncore.AppendStringElement(a, "0", o.Compressor)
		out, _ = bsoncore.AppendArrayEnd(a, aidx)
	}
	if o.ServiceID != nil {
		out = bsoncore.AppendObjectIDElement(out, "serviceId", *o.ServiceID)
	}
	return out
}

// Reply turns the upstream's hello reply into the proxy's: a router
// (msg "isdbgrid") with no trace of the upstream's topology (nor a
// serviceId of its own), keeping its wire versions, size limits, session
// timeout, SASL mechanisms and speculative authentication reply, with
// opts' fields added.
func Reply(reply bsoncore.Document, opts ReplyOptions) (bsoncore.Document, error) {
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
		out = opts.appendTo(out)
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
func RouterHello(legacy bool, l RouterHelloLimits, nowMillis int64, opts ReplyOptions) bsoncore.Document {
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
	out = opts.appendTo(out)
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

// helloEnvelope is the room left in a message for the command around the
// largest document a driver may send (insert, lsid, $clusterTime...).
const helloEnvelope = 4096

// CapLimits lowers the sizes a hello reply announces to the proxy's own
// message limit (maxMessageBytes), so that drivers split batches and refuse documents
// under it instead of sending messages the proxy must refuse.
func CapLimits(reply []byte, maxMessageBytes int) []byte {
	limits := map[string]int64{
		"maxMessageSizeBytes": int64(maxMessageBytes),
		// A document must fit in a message with its command around it.
		"maxBsonObjectSize": int64(maxMessageBytes) - helloEnvelope,
	}
	raw := bson.Raw(reply)
	over := func(key string) bool {
		v, ok := raw.Lookup(key).AsInt64OK()
		return ok && v > limits[key]
	}
	if !over("maxMessageSizeBytes") && !over("maxBsonObjectSize") {
		return reply
	}
	var d bson.D
	if err := bson.Unmarshal(reply, &d); err != nil {
		return reply
	}
	for i, e := range d {
		if limit, ok := limits[e.Key]; ok && over(e.Key) {
			d[i].Value = int32(limit)
		}
	}
	out, err := bson.Marshal(d)
	if err != nil {
		return reply
	}
	return out
}
