package backend

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a child exit when the process that started it dies
// (a test binary killed by its timeout runs no cleanup), and keeps it out
// of the terminal's process group so that a Ctrl-C reaches the parent
// first, which then stops it in order.
func dieWithParent(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = sig
}

// runAs runs cmd as u.
func runAs(cmd *exec.Cmd, u *osUser) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}
}
