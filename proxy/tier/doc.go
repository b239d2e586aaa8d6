// Package tier keeps a proxy's state of its staging tier (package
// rewrite/stage has the plans): per rule, the merge lock and the insert
// lock a freeze takes, the generation of the proxy's own staging
// collections, what it staged since its last freeze (the background
// merger's due policy and the room staged inserts wait for), the merge
// figures the metrics report (State); what merges know of a rule's
// buckets, so that the next merge need not read them again (Directories);
// and the wait between failed background merges (Backoff). It does no
// I/O: the proxy's merges read and change it around their plans.
package tier
