package service

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/vmrecord"
)

// killSessionProcesses kills every per-VM process of sessionDir (its QEMU
// follows, through its parent-death signal).
func killSessionProcesses(sessionDir string) {
	matches, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, m := range matches {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(m)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if b, err := os.ReadFile(m); err == nil && vmrecord.IsSessionProcess(b, sessionDir) {
			killPID(pid)
		}
	}
}

func killPID(pid int) {
	if pid > 0 {
		unix.Kill(pid, unix.SIGKILL)
	}
}

// watchPID returns a channel closed when pid exits. The process need not
// be a child (an adopted VM's belongs to whoever reaps orphans): a pidfd
// becomes readable when it exits.
func watchPID(pid int) (<-chan struct{}, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("watching pid %d: %w", pid, err)
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err == nil || !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return gone, nil
}
