package proxy

// Stats counts what the proxy holds open, for tests and diagnostics that
// check nothing leaks after clients go away.
type Stats struct {
	// ClientConns is the number of client connections being served.
	ClientConns int
	// UpstreamConns is the number of upstream connections those clients
	// hold (each client connection dials its own on first use).
	UpstreamConns int
	// Cursors is the number of rewritten-read cursors in the registry.
	Cursors int
}

// SharedInserts counts, since the start, the upstream inserts that
// carried more than one client's staged insert, and the client inserts
// that rode along in one another led.
func (s *Server) SharedInserts() (inserts, riders int64) {
	return s.eng.SharedInserts()
}

// BackgroundConns is the number of upstream connections of the proxy's
// background work (merges, retention) open now, in use or kept between
// rounds: the proxy's own, which outlive its clients.
func (s *Server) BackgroundConns() int { return s.eng.BackgroundConns() }

// Stats returns the current counts.
func (s *Server) Stats() Stats {
	st := Stats{Cursors: s.eng.OpenCursors()}
	s.mu.Lock()
	defer s.mu.Unlock()
	st.ClientConns = len(s.conns)
	for c := range s.conns {
		if c.h.HasUpstream() && !c.closed.Load() {
			st.UpstreamConns++
		}
	}
	return st
}

// ReadySpares is how many spare staging collections the proxy holds
// cleaned, for an insert to take.
func (s *Server) ReadySpares() int { return s.eng.ReadySpares() }
