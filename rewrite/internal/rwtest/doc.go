// Package rwtest holds the helpers the rewrite packages' table tests
// share: documents from Go values, their JSON for messages, the rules and
// upstream capabilities the tests use, and upstream cursor replies.
// Only tests import it.
package rwtest
