package upstream

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"time"
)

// RemoveStaleSocket removes the Unix socket file at path when no process
// answers on it: what a killed server leaves, on which a listen would
// fail. No file there is fine; a live socket, or a file that is not a
// socket, is an error and is left alone.
func RemoveStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("another process listens on %s", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("stale socket %s: %w", path, err)
	}
	return nil
}
