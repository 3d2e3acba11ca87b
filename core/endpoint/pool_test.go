package endpoint

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestHandlerPoolReusesIdleWorkers(t *testing.T) {
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	p := &handlerPool{jobs: make(chan func()), wg: &wg}
	const calls = 200
	for i := 0; i < calls; i++ {
		done := make(chan struct{})
		p.run(func() { close(done) })
		<-done
		// Let the worker get back to waiting for the next call.
		for j := 0; j < 100; j++ {
			runtime.Gosched()
		}
	}
	// One call at a time: the idle worker takes nearly every one (a call
	// that arrives while the worker is still on its way back starts
	// another; without reuse there would be one per call).
	if p.started > calls/4 {
		t.Fatalf("%d workers started for %d calls one at a time", p.started, calls)
	}
	p.close()
	wg.Wait()
	waitGoroutines(t, before)
}

func TestHandlerPoolRunsCallsConcurrently(t *testing.T) {
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	p := &handlerPool{jobs: make(chan func()), wg: &wg}
	const n = 16
	release := make(chan struct{})
	var running sync.WaitGroup
	running.Add(n)
	for i := 0; i < n; i++ {
		p.run(func() { running.Done(); <-release })
	}
	// All n must be running at once: none waits for another to finish.
	waitOrFail(t, &running, "16 blocked calls did not all start")
	if p.started != n {
		t.Fatalf("%d workers for %d concurrent calls", p.started, n)
	}
	// Close while they are busy: each finishes its call, then ends.
	p.close()
	close(release)
	wg.Wait()
	waitGoroutines(t, before)
}

func waitOrFail(t *testing.T, wg *sync.WaitGroup, msg string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
}

// waitGoroutines waits for the goroutine count to fall back to n.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before: workers left behind", runtime.NumGoroutine(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
