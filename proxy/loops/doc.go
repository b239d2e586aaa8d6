// Package loops runs the background loops of a proxy's rules, one
// goroutine per rule and kind (a merger for each rule that may stage, a
// retention loop for each rule with expireAfter), and follows the rule
// set as it changes: apps create, change and drop time-series
// collections, so Sync starts the loops of new rules, and stops and
// restarts those whose rule changed. It does no I/O itself.
package loops
