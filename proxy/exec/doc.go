// Package exec runs the proxy's plans (rewrite.Plan) on the upstream:
// Drive, the one loop of Next, a round trip per step, and Feed; the
// Runner a step goes through, and the runners that compose around one:
// OnConn (an upstream connection of the proxy's own, steps pipelined),
// Parallel (a merge's bucket inserts spread over helper connections),
// Timed (a merge's upstream time by kind of step); and Pool, the proxy's
// own upstream connections for merges and background rounds. It knows
// no commands: what a step holds is the plan's.
package exec
