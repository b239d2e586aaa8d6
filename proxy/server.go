package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tsproxy/tsproxy/proxy/engine"
	"github.com/tsproxy/tsproxy/proxy/handler"
	"github.com/tsproxy/tsproxy/proxy/telemetry"
)

// Options configures a Server (handler.Options: the engine's settings
// and the front door's).
type Options = handler.Options

// Server is a running proxy: the front door, which accepts client
// connections, reads their frames and hands each to its connection's
// handler (handler.Conn), and the engine the connections share
// (engine.Engine).
type Server struct {
	opts Options
	log  *slog.Logger
	tel  *telemetry.Instruments
	eng  *engine.Engine

	mu       sync.Mutex
	ln       net.Listener
	more     []net.Listener // Serve's other listeners (Unix sockets)
	conns    map[*conn]struct{}
	closing  atomic.Bool
	connWG   sync.WaitGroup
	nextID   atomic.Uint64
	numConns atomic.Int64
}

// New checks opts and returns a Server ready to Serve.
func New(opts Options) (*Server, error) {
	eng, err := handler.NewEngine(opts)
	if err != nil {
		return nil, err
	}
	opts = eng.Options()
	return &Server{opts: opts, log: opts.Logger, tel: eng.Telemetry(), eng: eng, conns: make(map[*conn]struct{})}, nil
}

// Serve accepts clients on ln, and on the listeners of more (Unix
// sockets for apps on this host: without TLS, which their permissions
// make needless), until Shutdown; it returns nil after a Shutdown and
// ln's accept error otherwise (one of more's is logged, and ends only
// that listener). ln's address names the proxy in writer leases: it is
// set before any listener accepts, so that every client's staged inserts
// go to collections of the same name.
func (s *Server) Serve(ln net.Listener, more ...net.Listener) error {
	if s.opts.TLS != nil {
		ln = tls.NewListener(ln, s.opts.TLS)
	}
	s.mu.Lock()
	s.ln, s.more = ln, more
	if s.closing.Load() {
		// Shutdown ran before Serve got here and found no listener to
		// close: close them now rather than accept forever.
		s.mu.Unlock()
		ln.Close()
		for _, l := range more {
			l.Close()
		}
		return nil
	}
	s.mu.Unlock()
	s.eng.Start(ln.Addr().String())
	for _, l := range more {
		go func() {
			if err := s.accept(l); err != nil {
				s.log.Error("listener stopped", "addr", l.Addr().String(), "err", err)
			}
		}()
	}
	return s.accept(ln)
}

// accept serves the clients of ln until it is closed.
func (s *Server) accept(ln net.Listener) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("proxy: accept: %w", err)
		}
		backoff = 0
		s.startConn(nc)
	}
}

// Addr is the address Serve listens on (nil before Serve).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Shutdown stops accepting, lets each connection finish the request it is
// serving, closes idle ones, and waits until all are gone or ctx ends (then
// it closes the rest).
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.eng.Stop()
	defer s.eng.Close()
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
	}
	for _, l := range s.more {
		l.Close()
	}
	for c := range s.conns {
		c.closeIfIdle()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.connWG.Wait(); s.eng.ReleaseLeases(ctx); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		// A connection may wait on the catalog behind a read the
		// upstream stopped answering: ending the catalog's context closes
		// its connection, which ends that read.
		s.eng.CancelCatalog()
		s.mu.Lock()
		for c := range s.conns {
			c.forceClose()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// Ready reports whether the proxy can serve now (for /readyz, which a
// load balancer's health check reads): not shutting down, the upstream
// reachable, and the time-series catalog read (commands on namespaces
// wait for it otherwise).
func (s *Server) Ready(ctx context.Context) error {
	if s.closing.Load() {
		return errors.New("shutting down")
	}
	return s.eng.Ready(ctx)
}

// OpenCursors is the number of rewritten-read cursors the proxy tracks.
func (s *Server) OpenCursors() int { return s.eng.OpenCursors() }

// Connections is the number of open client connections.
func (s *Server) Connections() int { return int(s.numConns.Load()) }
