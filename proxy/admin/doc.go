// Package admin serves the proxy's own commands: tsproxyFlush, which
// merges what the staging tier holds and counts it, and
// tsproxyStagingFormat, which reports or sets the staged document form
// of each staged rule. Each is authorized by the upstream on every
// namespace it names before it says anything of the rule.
package admin
