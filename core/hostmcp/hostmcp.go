// Package hostmcp is the MCP server of `capsem mcp`: the tools an AI agent
// on the host (Claude Code, Gemini CLI) drives sandboxes with. Each tool is
// a thin translation onto the capsem service (Service, which the service
// client implements); its failures come back as tool errors carrying the
// service's message.
//
// The tools form one table (tools), each entry its name, description,
// annotations and handler; further tools slot in as entries.
package hostmcp

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
)

// Service is what the tools need of the capsem service.
type Service interface {
	Version(ctx context.Context) (api.Version, error)
	List(ctx context.Context) ([]api.VM, error)
	Create(ctx context.Context, req api.CreateRequest) (api.VM, error)
	// CreateStream is Create, telling stage each stage of the VM's start.
	CreateStream(ctx context.Context, req api.CreateRequest, stage func(string)) (api.VM, error)
	Info(ctx context.Context, vm string) (api.VM, error)
	Exec(ctx context.Context, vm string, req api.ExecRequest) (api.ExecResult, error)
	// RunStream runs one command in a fresh VM the service removes when
	// the command ends or the call goes away; events tell the stages of
	// the VM's start and the VM once it is ready.
	RunStream(ctx context.Context, req api.RunRequest, events api.RunEvents, stdout, stderr io.Writer) (*api.ExecEvent, error)
	Stop(ctx context.Context, vm string) (api.VM, error)
	Resume(ctx context.Context, vm string, req api.ResumeRequest) (api.VM, error)
	Suspend(ctx context.Context, vm string) (api.VM, error)
	Persist(ctx context.Context, vm, name string) (api.VM, error)
	Delete(ctx context.Context, vm string) error
	Purge(ctx context.Context, all bool) (api.PurgeResult, error)
	ReadFile(ctx context.Context, vm string, req api.ReadFileRequest) (api.ReadFileResult, error)
	WriteFile(ctx context.Context, vm string, req api.WriteFileRequest) error
	Logs(ctx context.Context, vm string, tail int, grep string) (api.LogsResult, error)
	ServiceLogs(ctx context.Context, tail int, grep string) (api.LogsResult, error)
	Schema(ctx context.Context, vm string) (api.SchemaResult, error)
	Inspect(ctx context.Context, vm string, req api.InspectRequest) (api.InspectResult, error)
	Timeline(ctx context.Context, vm string, req api.TimelineRequest) (api.TimelineResult, error)
	Panics(ctx context.Context, req api.PanicsRequest) (api.PanicsResult, error)
	Triage(ctx context.Context, req api.TriageRequest) (api.TriageResult, error)
	Fork(ctx context.Context, vm string, req api.ForkRequest) (api.Image, error)
	Images(ctx context.Context) ([]api.Image, error)
	DeleteImage(ctx context.Context, name string) error
	mcpService
}

// Instructions is what the server tells a client at initialize.
const Instructions = `Capsem runs commands in disposable Linux VMs (sandboxes) and records what happens inside them in a per-VM SQLite ledger (session.db).

Quick one-shot, no VM to manage: capsem_run {command}.
Iterative debugging on a long-lived VM:
1. capsem_create (give a name to keep the VM's disk and ledger across stops)
2. capsem_exec {id, command}: run what you want to test
3. capsem_read_file / capsem_write_file: check or change state
4. capsem_inspect {id, sql}: query the ledger (capsem_inspect_schema lists its tables: mcp_calls, net_events, dns_events, exec_events, fs_events, model_calls); capsem_timeline {id, traceId?}: the same rows as one stream in time order (give capsem_exec a traceId to follow what one command caused)
5. capsem_vm_logs {id}: the guest console and the VM's process log, when something fails (capsem_host_logs {name}: the service's and this server's own; capsem_panics: crashes of any capsem process, with their traces; capsem_triage {id?}: what went wrong lately, ranked)
6. capsem_delete {id}: tear it down (capsem_stop keeps a named VM for capsem_resume)
Templates: capsem_fork {id, name} makes an image of a VM (installed packages, files, workspace); capsem_create {image: name} boots VMs from it; capsem_list shows images apart from VMs; capsem_delete {id: name} deletes an image no VM uses.

Commands have no timeout unless you pass one; pass timeout only when the user asked for a deadline.`

// New returns the MCP server of capsem mcp, its tools calling svc.
func New(svc Service, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "capsem", Title: "Capsem sandboxes", Version: version},
		&mcp.ServerOptions{Instructions: Instructions})
	t := &tools{svc: svc, version: version}
	t.register(s)
	return s
}

type tools struct {
	svc     Service
	version string
}

// progress sends notifications on the request's progress token (if the
// client gave one) every interval while work runs: the stages a create or
// a run goes through, and that it is still alive.
func progress(ctx context.Context, req *mcp.CallToolRequest, stage string) func(next string) {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return func(string) {}
	}
	var mu sync.Mutex // the heartbeat notifies from its own goroutine
	n := 0.0
	notify := func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		n++
		req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: n, Message: msg})
	}
	notify(stage)
	return notify
}

// stages reports the stages of a VM's start as progress, and between them
// a heartbeat that repeats the stage under way with the time it has taken
// so far. Its lock is held while notifying, so that a beat never follows
// the stage after its own.
type stages struct {
	notify func(string)
	mu     sync.Mutex
	last   string
	since  time.Time
}

func newStages(notify func(string)) *stages { return &stages{notify: notify} }

// next reports a new stage.
func (s *stages) next(stage string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.since = stage, time.Now()
	s.notify(stage)
}

// beat is the heartbeat's tick; elapsed is the call's time so far.
func (s *stages) beat(elapsed time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == "" {
		s.notify(fmt.Sprintf("working (%ds)", int(elapsed.Seconds())))
		return
	}
	s.notify(fmt.Sprintf("%s (%ds)", s.last, int(time.Since(s.since).Seconds())))
}

// heartbeat calls tick every interval until the returned stop is called;
// stop returns once no tick runs any more.
func heartbeat(interval time.Duration, tick func(elapsed time.Duration)) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				tick(time.Since(start))
			}
		}
	}()
	return func() { close(done); <-exited }
}
