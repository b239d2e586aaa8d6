// Package caps says what an upstream supports (detected once from its
// buildInfo): the rewrites choose their upstream commands by it.
package caps
