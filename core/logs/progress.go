package logs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Progress shows the stages of a long operation (a VM's start, an image
// build). On a terminal it is one status line rewritten in place, "what:
// stage (12 s)", its clock ticking while a stage lasts, and log records
// written above it; elsewhere (a file, a pipe, JSON lines) each stage is a
// log record at the level the caller gives, as before.
type Progress struct {
	log   *slog.Logger
	live  *HumanHandler // nil: stages are log records
	what  string
	start time.Time

	mu    sync.Mutex
	stage string
	done  chan struct{}
	wg    sync.WaitGroup
}

// NewProgress starts the progress of what (e.g. "starting the VM") on
// log; Done ends it.
func NewProgress(log *slog.Logger, what string) *Progress {
	p := &Progress{log: log, what: what, start: time.Now(), done: make(chan struct{})}
	if h, ok := log.Handler().(*HumanHandler); ok && h.term != nil {
		p.live = h
		p.wg.Add(1)
		go p.tick()
	}
	return p
}

// Stage reports the stage begun now: on the status line, or as a record
// at level.
func (p *Progress) Stage(stage string, level slog.Level) {
	if p.live == nil {
		p.log.Log(context.Background(), level, p.what, "stage", stage)
		return
	}
	p.mu.Lock()
	p.stage = stage
	p.mu.Unlock()
	p.draw()
}

func (p *Progress) draw() {
	p.mu.Lock()
	stage := p.stage
	p.mu.Unlock()
	line := p.what
	if stage != "" {
		line += ": " + oneLine(stage)
	}
	p.live.setStatus(fmt.Sprintf("capsem: %s (%d s)", line, int(time.Since(p.start).Seconds())))
}

func (p *Progress) tick() {
	defer p.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.draw()
		}
	}
}

// Done ends the progress: the status line goes. It may be called more
// than once.
func (p *Progress) Done() {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return
	default:
		close(p.done)
	}
	p.mu.Unlock()
	p.wg.Wait()
	if p.live != nil {
		p.live.setStatus("")
	}
}
