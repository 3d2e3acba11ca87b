package aggclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/aggwire"
)

// TestMain doubles as a fake aggregator when CAPSEM_FAKE_AGGREGATOR is set:
// "echo" answers at once, "sleep" answers after 300 ms (or never, if
// cancelled), "die" exits the process.
func TestMain(m *testing.M) {
	if os.Getenv("CAPSEM_FAKE_AGGREGATOR") != "" {
		fakeAggregator()
		return
	}
	os.Exit(m.Run())
}

func fakeAggregator() {
	r := aggwire.NewReader(os.Stdin)
	w := aggwire.NewWriter(os.Stdout)
	var mu sync.Mutex
	cancels := map[uint64]chan struct{}{}
	for {
		var req aggwire.Request
		if err := r.Read(&req); err != nil {
			os.Exit(0)
		}
		switch req.Method {
		case aggwire.MethodInit:
			w.Write(&aggwire.Response{ID: req.ID, Version: aggwire.ProtocolVersion})
		case aggwire.MethodCancel:
			mu.Lock()
			if c := cancels[req.Target]; c != nil {
				close(c)
				delete(cancels, req.Target)
			}
			mu.Unlock()
		case aggwire.MethodCallTool:
			switch req.Name {
			case "die":
				os.Exit(3)
			case "sleep":
				c := make(chan struct{})
				mu.Lock()
				cancels[req.ID] = c
				mu.Unlock()
				go func(id uint64) {
					select {
					case <-time.After(300 * time.Millisecond):
						w.Write(&aggwire.Response{ID: id, Result: []byte(`"slept"`)})
					case <-c:
						fmt.Fprintln(os.Stderr, "cancelled", id)
					}
				}(req.ID)
			default:
				w.Write(&aggwire.Response{ID: req.ID, Result: []byte(`"` + req.Name + `"`)})
			}
		}
	}
}

func fakeSpawner(t *testing.T, stderr io.Writer) Spawner {
	return func(ctx context.Context) (*exec.Cmd, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "CAPSEM_FAKE_AGGREGATOR=1")
		cmd.Stderr = stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd, nil
	}
}

func call(ctx context.Context, c *Client, name string) (string, error) {
	resp, err := c.Do(ctx, &aggwire.Request{Method: aggwire.MethodCallTool, Name: name})
	if err != nil {
		return "", err
	}
	return string(resp.Result), nil
}

func TestOutOfOrderCorrelation(t *testing.T) {
	c := Start(context.Background(), fakeSpawner(t, os.Stderr), nil, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	results := make(chan string, 20)
	for i := 0; i < 10; i++ {
		wg.Add(2)
		go func() { defer wg.Done(); r, _ := call(ctx, c, "sleep"); results <- r }()
		go func(i int) { defer wg.Done(); r, _ := call(ctx, c, fmt.Sprintf("n%d", i)); results <- r }(i)
	}
	wg.Wait()
	close(results)
	counts := map[string]int{}
	for r := range results {
		counts[r]++
	}
	if counts[`"slept"`] != 10 {
		t.Fatalf("results %v", counts)
	}
	for i := 0; i < 10; i++ {
		if counts[fmt.Sprintf(`"n%d"`, i)] != 1 {
			t.Fatalf("response for n%d misrouted: %v", i, counts)
		}
	}
}

func TestDeathFailsPendingAtOnceAndRestarts(t *testing.T) {
	c := Start(context.Background(), fakeSpawner(t, os.Stderr), nil, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := call(ctx, c, "warm"); err != nil {
		t.Fatal(err)
	}
	first := c.PID()
	pending := make(chan error, 1)
	go func() { _, err := call(ctx, c, "sleep"); pending <- err }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if _, err := call(ctx, c, "die"); err == nil || !strings.Contains(err.Error(), "aggregator exited") {
		t.Fatalf("call that killed it: %v", err)
	}
	if err := <-pending; err == nil || !strings.Contains(err.Error(), "aggregator exited") || time.Since(start) > time.Second {
		t.Fatalf("pending call: %v after %v", err, time.Since(start))
	}
	if r, err := call(ctx, c, "after"); err != nil || r != `"after"` {
		t.Fatalf("after restart: %q %v", r, err)
	}
	if c.PID() == first || c.Starts() != 2 {
		t.Fatalf("not restarted: pid %d→%d starts %d", first, c.PID(), c.Starts())
	}
	// The dead one was reaped.
	if err := syscall.Kill(first, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("old aggregator %d still exists: %v", first, err)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestContextCancelSendsCancel(t *testing.T) {
	var stderr lockedBuffer
	c := Start(context.Background(), fakeSpawner(t, &stderr), nil, nil)
	defer c.Close()
	if _, err := call(context.Background(), c, "warm"); err != nil { // started
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := call(ctx, c, "sleep"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(stderr.String(), "cancelled") {
		if time.Now().After(deadline) {
			t.Fatal("the aggregator never received the cancel")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCloseReapsAndLeaksNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	c := Start(context.Background(), fakeSpawner(t, os.Stderr), nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := call(ctx, c, "x"); err != nil {
		t.Fatal(err)
	}
	pid := c.PID()
	c.Close()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("aggregator %d not reaped: %v", pid, err)
	}
	if _, err := call(ctx, c, "x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
