package qemu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	st, ok := procState(pid)
	return ok && st != "Z" && st != "X"
}

// procState is the state letter from /proc/<pid>/stat.
func procState(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "", false
	}
	return s[i+2 : i+3], true
}

// assertReaped fails unless pid is gone entirely (no zombie) and no child
// of this process is a zombie.
func assertReaped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, exists := procState(pid)
		if !exists {
			break
		}
		if time.Now().After(deadline) {
			st, _ := procState(pid)
			t.Fatalf("QEMU pid %d still exists (state %s)", pid, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if z := zombieChildren(); len(z) > 0 {
		t.Fatalf("zombie children left: %v", z)
	}
}

func zombieChildren() []int {
	me := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var z []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] != "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == me {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			z = append(z, pid)
		}
	}
	return z
}
