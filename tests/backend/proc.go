package backend

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tsproxy/tsproxy/upstream"
)

// proc is a child process that dies with this one.
type proc struct {
	cmd  *exec.Cmd
	logs *tailBuffer
	done chan struct{} // closed when the child has exited
}

// startProc starts cmd with its output kept in a bounded buffer; deathSig
// is what the child gets if this process dies first.
func startProc(cmd *exec.Cmd, deathSig syscall.Signal) (*proc, error) {
	p := &proc{cmd: cmd, logs: &tailBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	dieWithParent(cmd, deathSig)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends sig and waits up to grace for the child to exit, then kills
// it.
func (p *proc) stop(sig os.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// output is the child's latest output ("" before it started).
func (p *proc) output() string {
	if p == nil {
		return ""
	}
	return p.logs.String()
}

// exited reports whether the child is gone.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitListen waits until addr accepts TCP connections, failing early if
// the child exits.
func (p *proc) waitListen(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := (&net.Dialer{}).DialContext(ctx, upstream.Network(addr), addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited before listening on %s:\n%s", p.cmd.Path, addr, p.logs)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %v: %v\n%s", p.cmd.Path, addr, timeout, err, p.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreeAddr is a loopback address no one listens on, for a child process
// that needs its port on the command line.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// tailBufferMax bounds what a child's logs may take: an upstream that
// logs every request at a verbose level must not fill the memory of a
// long test run.
const tailBufferMax = 1 << 20

// tailBuffer keeps the last tailBufferMax bytes written to it; it is safe
// for concurrent writers.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - tailBufferMax; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// contains reports whether the kept logs contain s.
func (b *tailBuffer) contains(s string) bool { return strings.Contains(b.String(), s) }
