package logs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestPanicHelper is not a test: run by TestFindPanicsOfRealProcesses as a
// child process, it logs a record and then crashes as its environment says.
func TestPanicHelper(t *testing.T) {
	kind := os.Getenv("CAPSEM_LOGS_TEST_CRASH")
	if kind == "" {
		t.Skip("only run as a child of TestFindPanicsOfRealProcesses")
	}
	os.Stderr.WriteString(`{"time":"2026-12-03T12:00:00.5Z","level":"INFO","msg":"about to crash"}` + "\n")
	switch kind {
	case "nil-map":
		var m map[string]int
		m["x"] = 1
	case "nested":
		defer func() { r := recover(); panic("while recovering: " + r.(string)) }()
		panic("first")
	case "fatal":
		var mu sync.Mutex
		mu.Unlock() // a fatal error, not a panic (deadlock detection would not do: the race detector keeps threads awake)
	case "hang":
		time.Sleep(time.Minute) // until its parent sends SIGQUIT
	}
}

// TestFindPanicsOfRealProcesses: the reports real Go processes write when
// they crash are found in their logs: message, goroutine, the first frame
// outside the runtime, the frames, and the time of the last record before.
func TestFindPanicsOfRealProcesses(t *testing.T) {
	var log bytes.Buffer
	log.WriteString(`{"time":"2026-12-03T11:00:00Z","level":"INFO","msg":"started"}` + "\n")
	for _, kind := range []string{"nil-map", "nested", "fatal"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPanicHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), "CAPSEM_LOGS_TEST_CRASH="+kind, "GOTRACEBACK=single")
		cmd.Stderr = &log
		if err := cmd.Run(); err == nil {
			t.Fatalf("%s: the child did not crash", kind)
		}
		log.WriteString(`{"time":"2026-12-03T13:00:00Z","level":"INFO","msg":"next"}` + "\n")
	}
	// A crash by a signal: SIGQUIT makes the runtime dump the process.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPanicHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CAPSEM_LOGS_TEST_CRASH=hang")
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past its first record
	cmd.Process.Signal(syscall.SIGQUIT)
	if err := cmd.Wait(); err == nil {
		t.Fatal("the child did not crash on SIGQUIT")
	}
	found := FindPanics(&log)
	if len(found) != 4 {
		t.Fatalf("%d reports found, want 4:\n%s", len(found), log.String())
	}
	if q := found[3]; q.Message != "SIGQUIT: quit" || !q.Fatal || q.Time != "2026-12-03T12:00:00.5Z" || len(q.Frames) == 0 {
		t.Errorf("the SIGQUIT dump: %+v", q)
	}
	for i, want := range []struct {
		message, location string
		fatal             bool
	}{
		{"assignment to entry in nil map", "logs.TestPanicHelper", false},
		{"first [recovered]\npanic: while recovering: first", "logs.TestPanicHelper.func1", false},
		{"sync: unlock of unlocked mutex", "logs.TestPanicHelper", true},
	} {
		p := found[i]
		if !strings.HasPrefix(p.Message, want.message) || p.Fatal != want.fatal || p.Time != "2026-12-03T12:00:00.5Z" || p.Goroutine == 0 ||
			!strings.Contains(p.Location, want.location+"(") || !strings.Contains(p.Location, "panics_test.go:") || len(p.Frames) < 2 {
			t.Errorf("report %d: %+v\nwant message %q, location %s, fatal %v", i, p, want.message, want.location, want.fatal)
		}
	}
}

// FuzzFindPanics: any log text is read to its end without a panic of its
// own, and what it reports stays within its bounds.
func FuzzFindPanics(f *testing.F) {
	f.Add("panic: x\n\ngoroutine 1 [running]:\nmain.main()\n\t/a.go:1 +0x1\n")
	f.Add("fatal error: y\n\ngoroutine 7 [chan receive]:\n")
	f.Add("{\"time\":\"t\"}\npanic: z [recovered]\n\tpanic: w\n\ngoroutine x [y]:\n\n")
	f.Add("panic: \npanic: \n\n\n")
	f.Fuzz(func(t *testing.T, text string) {
		for _, p := range FindPanics(strings.NewReader(text)) {
			if len(p.Frames) > MaxPanicFrames || len(p.Message) > MaxPanicMessage {
				t.Fatalf("out of bounds: %d frames, %d message bytes", len(p.Frames), len(p.Message))
			}
		}
	})
}
