package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
)

// runningExec is an exec that a Cancel can reach.
type runningExec struct {
	cancel     chan struct{}
	cancelOnce sync.Once
}

func (r *runningExec) stop() { r.cancelOnce.Do(func() { close(r.cancel) }) }

// cancel ends request id: it kills an exec's process group, or stops a
// file transfer whose host gave up.
func (s *Server) cancel(id uint64) {
	s.mu.Lock()
	r := s.execs[id]
	stop := s.transferStops[id]
	s.mu.Unlock()
	if r != nil {
		r.stop()
	}
	if stop != nil {
		stop()
	}
}

// outPump copies one output pipe to its stream up to the cap, and counts
// (and drops) the rest. It keeps draining after the stream is gone so the
// process never blocks on a full pipe or dies of SIGPIPE because of us.
type outPump struct {
	which  string
	cap    int64
	total  atomic.Int64
	done   chan struct{}
	mu     sync.Mutex // held across a stream write, so detach waits it out
	stream net.Conn
	sent   int64
	broken bool // the stream failed or was detached: drain only
}

// Exec output is copied in pieces that grow with the output: under TCG
// each read, stream write and wake-up costs the guest more than the bytes
// it moves, so a command writing fast is copied in large pieces, while one
// printing little holds a small buffer.
const (
	outputBufMin = 32 << 10
	outputBufMax = 256 << 10
	// outputPipeSize is the capacity asked for each output pipe (Linux's
	// default is 64 KiB): a command writing fast fills it while the pump
	// sends, and the pump then finds a piece as large as its buffer at a
	// read. It counts against root's pipe pages (fs.pipe-user-pages-soft,
	// 64 MiB), which a hundred execs at once stay far below.
	outputPipeSize = outputBufMax
)

func (p *outPump) run(r *os.File) {
	defer close(p.done)
	defer r.Close()
	buf := make([]byte, outputBufMin)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			p.total.Add(int64(n))
			p.forward(buf[:n])
		}
		if err != nil {
			return
		}
		if n == len(buf) && len(buf) < outputBufMax {
			buf = make([]byte, 2*len(buf))
		}
	}
}

// outputPipe makes the pipe of one of an exec's outputs, as large as
// outputPipeSize when the system allows (a smaller one only costs speed).
func outputPipe() (r, w *os.File, err error) {
	r, w, err = os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	if rc, err := r.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, outputPipeSize) })
	}
	return r, w, nil
}

func (p *outPump) forward(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken {
		return
	}
	if room := p.cap - p.sent; int64(len(b)) > room {
		b = b[:room]
	}
	if len(b) == 0 {
		return
	}
	n, err := p.stream.Write(b)
	p.sent += int64(n)
	if err != nil {
		p.broken = true
	}
}

// finish closes the stream (EOF for the host) and returns what was sent.
// After it, the pump only drains.
func (p *outPump) finish() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broken = true
	p.stream.Close()
	return p.sent
}

// registerExec makes an exec reachable by Cancel before it runs: Serve calls
// it in its read loop, so a Cancel read after the Exec always finds it.
func (s *Server) registerExec(reqID uint64, e *guestwire.Exec) (uint64, *runningExec, error) {
	if err := guestwire.ValidateExec(e); err != nil {
		return 0, nil, err
	}
	id := e.StreamID
	if id == 0 {
		id = reqID
	}
	run := &runningExec{cancel: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.execs == nil {
		s.execs = map[uint64]*runningExec{}
	}
	if _, dup := s.execs[id]; dup {
		return 0, nil, guestwire.Errorf(guestwire.CodeBusy, "exec id %d is already running", id)
	}
	s.execs[id] = run
	return id, run, nil
}

// exec runs one registered command to completion: it opens both output
// streams first (a failure there means nothing ran), starts the process in
// its own process group, forwards its outputs, kills the group on timeout,
// cancel or Serve's end, and answers only once both streams are closed.
func (s *Server) exec(ctx context.Context, id uint64, run *runningExec, e *guestwire.Exec) (*guestwire.ExecResult, error) {
	defer func() {
		s.mu.Lock()
		delete(s.execs, id)
		s.mu.Unlock()
	}()
	select {
	case <-run.cancel:
		return nil, guestwire.Errorf(guestwire.CodeInvalid, "exec %d was cancelled before it started", id)
	default:
	}

	env := s.execEnv(e.Env)
	argv := e.Argv
	if e.Shell != "" {
		argv = []string{"/bin/sh", "-c", e.Shell}
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return nil, err
	}
	cwd := e.Cwd
	if cwd == "" {
		cwd = s.defaultCwd()
	}
	if st, err := os.Stat(cwd); err != nil {
		return nil, fsError("exec: working directory", cwd, err)
	} else if !st.IsDir() {
		return nil, guestwire.Errorf(guestwire.CodeNotDir, "exec: working directory %s is not a directory", cwd)
	}

	pumps := [2]*outPump{
		{which: guestwire.StreamStdout, cap: guestwire.OutputCap(e.StdoutCap), done: make(chan struct{})},
		{which: guestwire.StreamStderr, cap: guestwire.OutputCap(e.StderrCap), done: make(chan struct{})},
	}
	// Both streams at once: each open is a round trip to the host.
	streamsStart := time.Now()
	var (
		dialed  sync.WaitGroup
		dialErr [2]error
	)
	for i, p := range pumps {
		dialed.Add(1)
		go func() {
			defer dialed.Done()
			p.stream, dialErr[i] = s.openDataStream(ctx, id, p.which)
		}()
	}
	dialed.Wait()
	for _, err := range dialErr {
		if err != nil {
			for _, p := range pumps {
				if p.stream != nil {
					p.stream.Close()
				}
			}
			return nil, err
		}
	}
	streamsMS := time.Since(streamsStart).Milliseconds()
	closeStreams := func() {
		for _, p := range pumps {
			p.finish()
		}
	}

	var readEnds, writeEnds [2]*os.File
	for i := range pumps {
		r, w, err := outputPipe()
		if err != nil {
			closeStreams()
			closeAll(readEnds[:i]...)
			closeAll(writeEnds[:i]...)
			return nil, guestwire.Errorf(guestwire.CodeIO, "exec: creating a pipe: %v", err)
		}
		readEnds[i], writeEnds[i] = r, w
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		closeStreams()
		closeAll(readEnds[:]...)
		closeAll(writeEnds[:]...)
		return nil, guestwire.Errorf(guestwire.CodeIO, "exec: opening %s for stdin: %v", os.DevNull, err)
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{devNull.Fd(), writeEnds[0].Fd(), writeEnds[1].Fd()},
		// Its own process group, so a timeout can kill everything it started.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	}
	started := time.Now()
	pid, exited, err := s.Reaper.Start(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	closeAll(devNull, writeEnds[0], writeEnds[1])
	if err != nil {
		closeStreams()
		closeAll(readEnds[:]...)
		return nil, execError(path, err)
	}
	for i, p := range pumps {
		go p.run(readEnds[i])
	}
	log := s.log().With("exec_id", id, "pid", pid)
	log.Debug("exec started", "argv0", argv[0], "streams_ms", streamsMS, "start_ms", time.Since(streamsStart).Milliseconds())

	var timeout <-chan time.Time
	if e.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(e.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	killGroup := func(why string) {
		// The group outlives its leader while anything in it runs, so this
		// also reaches background children after the leader has exited.
		if err := unix.Kill(-pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			log.Warn("killing the process group", "why", why, "err", err)
		}
	}
	var (
		ws        unix.WaitStatus
		haveExit  bool
		timedOut  bool
		detached  bool
		cancel    = run.cancel
		ctxDone   = ctx.Done()
		outputs   = 0
		grace     <-chan time.Time
		graceFor  = s.OutputGrace
		pumpDone0 = pumps[0].done
		pumpDone1 = pumps[1].done
	)
	for !haveExit || outputs < 2 {
		select {
		case ws = <-exited:
			haveExit = true
			exited = nil
			if outputs < 2 {
				if graceFor <= 0 {
					graceFor = 2 * time.Second
				}
				t := time.NewTimer(graceFor)
				defer t.Stop()
				grace = t.C
			}
		case <-pumpDone0:
			outputs++
			pumpDone0 = nil
		case <-pumpDone1:
			outputs++
			pumpDone1 = nil
		case <-timeout:
			timedOut = true
			timeout = nil
			killGroup("timeout")
		case <-cancel:
			cancel = nil
			killGroup("cancelled by the host")
		case <-ctxDone:
			ctxDone = nil
			killGroup("the control connection ended")
		case <-grace:
			// The process exited but something it started still holds its
			// output: answer now and let the pumps drain in the background.
			detached = true
			outputs = 2
			log.Info("exec output still open after the process exited; detaching", "grace", graceFor)
		}
	}
	// Totals are read after finish, which waits out any write in progress.
	sent := [2]int64{pumps[0].finish(), pumps[1].finish()}
	res := &guestwire.ExecResult{
		TimedOut:    timedOut,
		StdoutBytes: pumps[0].total.Load(), StderrBytes: pumps[1].total.Load(),
		StdoutSent: sent[0], StderrSent: sent[1],
		DurationMS: time.Since(started).Milliseconds(),
		Detached:   detached,
	}
	res.StdoutTruncated = res.StdoutBytes > pumps[0].cap
	res.StderrTruncated = res.StderrBytes > pumps[1].cap
	switch {
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		res.Signal = int(ws.Signal())
		res.ExitCode = 128 + res.Signal
	}
	log.Debug("exec done", "exit_code", res.ExitCode, "signal", res.Signal, "timed_out", timedOut, "ms", res.DurationMS)
	return res, nil
}

// openDataStream opens the data stream (exec output or file transfer) for
// request id.
func (s *Server) openDataStream(ctx context.Context, id uint64, which string) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := s.Dial(dctx, guestchan.PortExecOutput)
	if err != nil {
		return nil, guestwire.Errorf(guestwire.CodeIO, "opening the %s stream to the host: %v", which, err)
	}
	if err := guestwire.WriteStreamHeader(c, guestwire.StreamHeader{ID: id, Which: which}); err != nil {
		c.Close()
		return nil, guestwire.Errorf(guestwire.CodeIO, "starting the %s stream: %v", which, err)
	}
	return c, nil
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

func execError(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return guestwire.Errorf(guestwire.CodeNotFound, "exec %s: no such file or directory", path)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return guestwire.Errorf(guestwire.CodePermission, "exec %s: permission denied", path)
	}
	return guestwire.Errorf(guestwire.CodeIO, "exec %s: %v", path, err)
}

// lookPath finds name in the exec's own PATH (not the agent's), the way a
// shell would.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathEnv := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", guestwire.Errorf(guestwire.CodeNotFound, "exec %q: executable file not found in PATH=%s", name, pathEnv)
}
