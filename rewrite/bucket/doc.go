// Package bucket is the stored format of the events layout, and the one
// place that knows it: the field names of a bucket document, the
// deterministic bucket ids ((series, window, seq) → ObjectId), how an
// app's event becomes a stored event and back, how events are grouped and
// chunked into buckets, the per-bucket summaries (count, bytes, min, max,
// sum, counts, lowBit) and the update that adds events to an open bucket.
//
// Changing what this package writes changes the stored format and needs a
// migration. It does no I/O and knows nothing of commands or the proxy.
package bucket
