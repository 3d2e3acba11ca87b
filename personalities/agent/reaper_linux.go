package agent

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Reaper is the one place in the agent that waits for children. As PID 1 the
// agent inherits every orphan in the VM and must reap them, but a blanket
// wait4(-1) would also steal the exit status of a command an exec is waiting
// for. So every child the agent starts goes through Reaper.Start, which
// records its pid under the same lock the reaping pass holds: a pass either
// runs before the fork (the pid does not exist yet) or after the pid is
// recorded, never in between. Recorded pids get their status on a channel;
// any other child is an orphan and is reaped and forgotten.
//
// With all=false (tests: the agent is not PID 1 and shares its process with
// the test binary) only recorded pids are waited for, so other children of
// the process keep their statuses.
type Reaper struct {
	log *slog.Logger
	all bool

	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
	reaped  int // orphans reaped, for tests and logs

	sig  chan os.Signal
	stop chan struct{}
	done chan struct{}
}

// reaperSweep is a safety net for a lost wake-up: a pass also runs this often.
const reaperSweep = 2 * time.Second

// NewReaper starts a reaper. all reaps every child (PID 1 or a subreaper);
// otherwise only children started through Start are waited for.
func NewReaper(log *slog.Logger, all bool) *Reaper {
	r := &Reaper{
		log: log, all: all, waiting: map[int]chan unix.WaitStatus{},
		sig: make(chan os.Signal, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	signal.Notify(r.sig, unix.SIGCHLD)
	go r.loop()
	return r
}

// Close stops the reaper. Children still recorded never get a status.
func (r *Reaper) Close() {
	select {
	case <-r.stop:
		return
	default:
	}
	signal.Stop(r.sig)
	close(r.stop)
	<-r.done
}

// Start runs start (which forks a child and returns its pid) so that no
// reaping pass can run between the fork and the pid being recorded. The
// returned channel receives the child's wait status once.
func (r *Reaper) Start(start func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	pid, err := start()
	if err != nil {
		r.mu.Unlock()
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[pid] = ch
	r.mu.Unlock()
	// The child may already have exited and its SIGCHLD been spent on a
	// pass that was waiting for the lock; make sure a pass follows.
	r.poke()
	return pid, ch, nil
}

// Orphans returns how many children nobody was waiting for have been reaped.
func (r *Reaper) Orphans() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reaped
}

func (r *Reaper) poke() {
	select {
	case r.sig <- unix.SIGCHLD:
	default:
	}
}

func (r *Reaper) loop() {
	defer close(r.done)
	t := time.NewTicker(reaperSweep)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-r.sig:
		case <-t.C:
		}
		r.pass()
	}
}

// pass reaps everything that has exited. SIGCHLD coalesces, so it loops
// until nothing is left.
func (r *Reaper) pass() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws unix.WaitStatus
	if r.all {
		for {
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.deliver(pid, ws)
		}
	}
	for pid := range r.waiting {
		for {
			got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err == nil && got == pid {
				r.deliver(pid, ws)
			} else if errors.Is(err, unix.ECHILD) {
				// Someone else reaped it; report a failure rather than
				// leave its waiter hanging.
				r.log.Warn("an exec child was reaped elsewhere", "pid", pid)
				r.deliver(pid, unix.WaitStatus(0xff00))
			}
			break
		}
	}
}

func (r *Reaper) deliver(pid int, ws unix.WaitStatus) {
	if !ws.Exited() && !ws.Signaled() {
		return // stopped or continued: still alive
	}
	if ch, ok := r.waiting[pid]; ok {
		delete(r.waiting, pid)
		ch <- ws
		return
	}
	r.reaped++
	r.log.Debug("reaped an orphan", "pid", pid, "status", int(ws))
}
