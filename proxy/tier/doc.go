// Package tier is a proxy's staging tier (rewrite/stage and
// rewrite/stage/merge have the plans): staged inserts go to staging collections with no lock, no
// update and no lease, and merges write their buckets. Tier runs the
// tier's work: the settling of a rule before a command that reads or
// changes its events (Flush), tsproxyFlush's merges, the background merge
// loop of each rule (MergeLoop), the writer lease a merge holds
// (EnsureWriter, package tier/lease), what staged inserts keep for their
// merge (RunKept), inserts of many clients shared as one (RunCombined),
// spare staging collections, and the rules' staging format records. It
// asks the proxy what it runs in through Host, answers what a merge asks
// of it through merge.Host (mergeHost), and runs a client's work on its
// connection (Client), every command through proxy/exec.
//
// The state it keeps is per rule: the merge lock and the insert lock a
// freeze takes, the generation of the proxy's own staging collections,
// what it staged since its last freeze (the background merger's due
// policy and the room staged inserts wait for), the merge figures the
// metrics report (State); what merges know of a rule's buckets, so that
// the next merge need not read them again (Directories); and the wait
// between failed background merges (Backoff).
package tier
