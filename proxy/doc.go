// Package proxy is the front door: it accepts client connections (TCP,
// TLS, Unix sockets), bounds them (connections, frame sizes, frame and
// write timeouts), reads each client's frames and hands each to the
// connection's handler (package proxy/handler), writes the replies the
// handler gives it, and watches for a client that leaves while its
// request waits on the upstream. It holds no command logic: Server is the
// listeners, the connections and the engine they share (engine.Engine),
// and Shutdown drains them in order.
//
// A connection's frames are handled one at a time on its own goroutine;
// the one recover of the proxy is at that boundary, and closes only that
// connection. Nothing is process-wide: two Servers in one process share
// nothing, and the metrics a Server registers end at its Shutdown.
package proxy
