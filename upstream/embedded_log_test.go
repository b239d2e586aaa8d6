package upstream

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
)

// TestLazyAttrsSameOutput: deferring WithAttrs/WithGroup changes when the
// attributes are formatted, never what is printed.
func TestLazyAttrsSameOutput(t *testing.T) {
	build := func(l *slog.Logger) {
		l = l.With("a", 1).WithGroup("g").With("b", "x y")
		l.With("c", []any{"d", 2}).Warn("msg", "e", 3)
		l.Debug("dropped", "f", 4)
		l.WithGroup("").With().Error("second")
	}
	var eager, lazy bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}
	build(slog.New(slog.NewTextHandler(&eager, opts)))
	build(slog.New(lazyAttrs{h: slog.NewTextHandler(&lazy, opts)}))
	if eager.String() != lazy.String() || eager.Len() == 0 {
		t.Fatalf("lazy output differs:\n%s\nwant:\n%s", lazy.String(), eager.String())
	}
}

// TestLazyAttrsDisabledIsFree: a With whose records are all below the
// level never formats its attributes.
func TestLazyAttrsDisabledIsFree(t *testing.T) {
	var out bytes.Buffer
	l := slog.New(lazyAttrs{h: slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelError})})
	formatted := false
	l.With("args", slog.AnyValue(valuer(func() slog.Value { formatted = true; return slog.StringValue("big") }))).DebugContext(context.Background(), ">>> INSERT")
	if formatted || out.Len() != 0 {
		t.Fatalf("disabled record formatted its attributes (out %q)", out.String())
	}
}

type valuer func() slog.Value

func (v valuer) LogValue() slog.Value { return v() }
