package upstream

import (
	"context"
	"log/slog"
)

// lazyAttrs defers a handler's WithAttrs and WithGroup until a record is
// actually handled. FerretDB v1.24 calls Logger.With(args...) around every
// SQL statement, args being the whole JSON of the documents written, and
// only then logs at debug level; slog's text and JSON handlers format
// those attributes eagerly in WithAttrs, so without this every write paid
// for quoting its own documents into a log line that was never printed
// (about 15% of the embedded upstream's CPU under ingest, measured with
// tsbench -cpuprofile).
type lazyAttrs struct {
	h   slog.Handler
	ops []handlerOp // applied in order to h when a record is handled
}

// handlerOp is one deferred WithAttrs (group == "") or WithGroup.
type handlerOp struct {
	attrs []slog.Attr
	group string
}

func (l lazyAttrs) Enabled(ctx context.Context, lv slog.Level) bool { return l.h.Enabled(ctx, lv) }

func (l lazyAttrs) Handle(ctx context.Context, r slog.Record) error {
	h := l.h
	for _, op := range l.ops {
		if op.group != "" {
			h = h.WithGroup(op.group)
		} else {
			h = h.WithAttrs(op.attrs)
		}
	}
	return h.Handle(ctx, r)
}

func (l lazyAttrs) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return l
	}
	return lazyAttrs{h: l.h, ops: append(l.ops[:len(l.ops):len(l.ops)], handlerOp{attrs: attrs})}
}

func (l lazyAttrs) WithGroup(name string) slog.Handler {
	if name == "" {
		return l
	}
	return lazyAttrs{h: l.h, ops: append(l.ops[:len(l.ops):len(l.ops)], handlerOp{group: name})}
}
