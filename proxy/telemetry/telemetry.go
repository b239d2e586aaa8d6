package telemetry

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const instrumentationName = "github.com/tsproxy/tsproxy/proxy"

// Instruments are one proxy's instruments; safe for concurrent use.
type Instruments struct {
	tracer   trace.Tracer
	tracing  bool
	conns    metric.Int64UpDownCounter
	commands metric.Int64Counter
	errors   metric.Int64Counter
	bytes    metric.Int64Counter
	latency  metric.Float64Histogram
	upLat    metric.Float64Histogram

	inSet, outSet []metric.AddOption // built once, as commandOpts
	attrs         sync.Map           // attrKey -> *commandOpts
	// known bounds the label values of the command metrics: a client can
	// send any command name, and each new label value costs memory
	// forever.
	known map[string]bool
}

type attrKey struct{ name, route string }

// New returns the instruments; commands named in known (and the usual
// MongoDB commands) are labelled by name, others as "other".
func New(tracing bool, known []string) (*Instruments, error) {
	m := otel.Meter(instrumentationName)
	t := &Instruments{tracer: otel.Tracer(instrumentationName), tracing: tracing, known: map[string]bool{}}
	for _, n := range append(usualCommands, known...) {
		t.known[n] = true
	}
	var err error
	if t.conns, err = m.Int64UpDownCounter("tsproxy.connections", metric.WithDescription("Open client connections.")); err != nil {
		return nil, err
	}
	if t.commands, err = m.Int64Counter("tsproxy.commands", metric.WithDescription("Commands served, by command name and route.")); err != nil {
		return nil, err
	}
	if t.errors, err = m.Int64Counter("tsproxy.errors", metric.WithDescription("Errors, by kind.")); err != nil {
		return nil, err
	}
	if t.bytes, err = m.Int64Counter("tsproxy.bytes", metric.WithDescription("Bytes from and to clients."), metric.WithUnit("By")); err != nil {
		return nil, err
	}
	buckets := metric.WithExplicitBucketBoundaries(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
	if t.latency, err = m.Float64Histogram("tsproxy.command.duration", metric.WithDescription("Time from a request's arrival to its reply."), metric.WithUnit("s"), buckets); err != nil {
		return nil, err
	}
	if t.upLat, err = m.Float64Histogram("tsproxy.upstream.duration", metric.WithDescription("Time spent waiting on the upstream per command."), metric.WithUnit("s"), buckets); err != nil {
		return nil, err
	}
	t.inSet = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("direction", "in")))}
	t.outSet = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("direction", "out")))}
	return t, nil
}

// ConnOpened and ConnClosed count client connections.
func (t *Instruments) ConnOpened() { t.conns.Add(context.Background(), 1) }
func (t *Instruments) ConnClosed() { t.conns.Add(context.Background(), -1) }

// BytesIn and BytesOut count client traffic.
func (t *Instruments) BytesIn(n int) {
	t.bytes.Add(context.Background(), int64(n), t.inSet...)
}
func (t *Instruments) BytesOut(n int) {
	t.bytes.Add(context.Background(), int64(n), t.outSet...)
}

// ErrorSeen counts an error of a kind (a code name, or the proxy's own).
func (t *Instruments) ErrorSeen(kind string) {
	t.errors.Add(context.Background(), 1, metric.WithAttributes(attribute.String("kind", kind)))
}

var usualCommands = []string{"aggregate", "count", "distinct", "find", "getMore", "killCursors",
	"insert", "update", "delete", "findAndModify", "bulkWrite", "hello", "isMaster", "ismaster",
	"ping", "saslStart", "saslContinue", "authenticate", "logout", "endSessions", "commitTransaction",
	"abortTransaction", "createIndexes", "dropIndexes", "listIndexes", "listCollections",
	"listDatabases", "create", "drop", "dropDatabase", "collStats", "dbStats", "explain",
	"buildInfo", "serverStatus", "getParameter", "renameCollection", "collMod", "connectionStatus",
	"whatsmyuri", "getLog", "hostInfo", "validate", "currentOp", "killOp", "getCmdLineOpts"}

// commandOpts are one (command, route)'s attributes as the option slices
// the instruments take, built once: passing a new variadic slice on every
// command would allocate it each time.
type commandOpts struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

func (t *Instruments) attrsFor(name, route string) *commandOpts {
	if !t.known[name] {
		name = "other"
	}
	k := attrKey{name, route}
	if v, ok := t.attrs.Load(k); ok {
		return v.(*commandOpts)
	}
	set := metric.WithAttributeSet(attribute.NewSet(attribute.String("command", name), attribute.String("route", k.route)))
	v := &commandOpts{add: []metric.AddOption{set}, record: []metric.RecordOption{set}}
	t.attrs.Store(k, v)
	return v
}

// Span measures one command.
type Span struct {
	t           *Instruments
	name, route string
	start       time.Time
	span        trace.Span
}

// Start begins measuring command name on database db, which arrived at
// start and takes route (passthrough, bucketed, cursor...).
func (t *Instruments) Start(name, db, route string, start time.Time) Span {
	cs := Span{t: t, name: name, route: route, start: start}
	if t.tracing {
		_, cs.span = t.tracer.Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("db.system", "mongodb"), attribute.String("db.operation", name),
				attribute.String("db.name", db), attribute.String("tsproxy.route", route)))
	}
	return cs
}

// End records the command's metrics (and ends its span): upstream is the
// time spent waiting on the upstream.
func (cs Span) End(upstream time.Duration, err error) {
	ctx := context.Background()
	attrs := cs.t.attrsFor(cs.name, cs.route)
	cs.t.commands.Add(ctx, 1, attrs.add...)
	cs.t.upLat.Record(ctx, upstream.Seconds(), attrs.record...)
	cs.t.latency.Record(ctx, time.Since(cs.start).Seconds(), attrs.record...)
	if cs.span != nil {
		cs.span.SetAttributes(attribute.Float64("tsproxy.upstream_seconds", upstream.Seconds()))
		if err != nil {
			cs.span.RecordError(err)
			cs.span.SetStatus(codes.Error, err.Error())
		}
		cs.span.End()
	}
}
