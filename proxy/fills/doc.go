// Package fills is the proxy's memory of the open bucket of each
// (bucket namespace, series, window) key, and the locks that serialize
// the writers of a key within one proxy. It does no I/O.
package fills
