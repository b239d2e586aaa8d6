// Package rules owns the configuration schema of tsproxy, its validation,
// the lookup from a namespace to the rule that buckets it and the bucket math
// (which window a timestamp falls in). The stored bucket document is
// rewrite/bucket's. It knows nothing of sockets.
package rules
