// Package fuzz holds the fuzz targets that cross rewrite families: the
// reply mapping of every read, the admin commands, and the round trip of
// an event through insert and read. Their corpora are under
// testdata/fuzz. Test-only.
package fuzz
