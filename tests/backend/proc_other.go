//go:build !linux

package backend

import (
	"os/exec"
	"syscall"
)

// dieWithParent does nothing outside Linux: there children are stopped by
// Close only.
func dieWithParent(*exec.Cmd, syscall.Signal) {}

// runAs is never needed outside Linux: clusterUser asks for it only when
// running as root, which the tests do on Linux CI machines only.
func runAs(*exec.Cmd, *osUser) {}
