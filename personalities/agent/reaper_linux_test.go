package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestwire"
)

const reaperHelperEnv = "CAPSEM_AGENT_TEST_REAPER_HELPER"

// TestReaperAllModeKeepsExecStatuses runs the reaper the way PID 1 does
// (wait4(-1) on every SIGCHLD) in a child process that is a subreaper, so
// orphans come to it, and checks that concurrent execs still get their own
// exit statuses while orphans are reaped and no zombie is left. It runs in a
// child so the blanket wait cannot steal statuses from the test binary.
func TestReaperAllModeKeepsExecStatuses(t *testing.T) {
	if os.Getenv(reaperHelperEnv) == "1" {
		reaperHelper(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReaperAllModeKeepsExecStatuses$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), reaperHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS")) {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

func reaperHelper(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	all := NewReaper(testLog(t), true)
	defer all.Close()
	h := start(t, func(s *Server) { s.Reaper = all })
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each leaves orphans behind (the subshells exit at once), whose
			// deaths wake the reaper while the execs are being waited for.
			script := fmt.Sprintf("(sleep 0.05 &); (true &); (sleep 0.0%d &); exit %d", i%10, 10+i)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := h.client.Exec(ctx, &guestwire.Exec{Shell: script}, nil, nil)
			if err != nil {
				errs <- err
			} else if res.ExitCode != 10+i {
				errs <- fmt.Errorf("exec %d: exit code %d, want %d (status stolen?)", i, res.ExitCode, 10+i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		zombies := zombieChildren()
		if len(zombies) == 0 && all.Orphans() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombie children %v, orphans reaped %d", zombies, all.Orphans())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// zombieChildren lists this process's children that are zombies.
func zombieChildren() []int {
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(self) {
			out = append(out, pid)
		}
	}
	return out
}
