// Package abilities is what the proxy knows of its upstream, learned
// once and shared by its connections: its limits (hello), what it
// supports (caps.Detect, then the probes of rewrite/admin where a server
// claims a MongoDB version it does not act as), what a find by _id on a
// bucket collection costs (the upstream's explain), and its write slots.
// Abilities are probed, never inferred from a version string alone.
package abilities
