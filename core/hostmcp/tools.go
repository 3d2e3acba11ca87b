package hostmcp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
)

// Inputs. Parameters are camelCase on the wire; a field without omitempty
// is required.
type (
	RunIn struct {
		Command string            `json:"command" jsonschema:"shell command to run (/bin/sh -c)"`
		Timeout int               `json:"timeout,omitempty" jsonschema:"seconds after which the command is killed; none unless the user asked for a deadline"`
		Env     map[string]string `json:"env,omitempty" jsonschema:"environment variables for the command"`
		Base    string            `json:"base,omitempty" jsonschema:"the VM's root: full (the default) or minimal (busybox only, quicker to start)"`
	}
	ListIn struct{}
	IDIn   struct {
		ID string `json:"id" jsonschema:"the VM's id or name"`
	}
	ForkIn struct {
		ID          string `json:"id" jsonschema:"the id or name of the VM to fork (running or stopped)"`
		Name        string `json:"name" jsonschema:"the image's name: lower-case letters, digits and '-'; no VM or image may have it already"`
		Description string `json:"description,omitempty" jsonschema:"what the image is for"`
		Memory      bool   `json:"memory,omitempty" jsonschema:"also keep the VM's memory and CPU state (a running or suspended VM): every VM made from the image resumes with the source's processes running where they were, each with its own identity, clock and entropy"`
	}
	DeleteIn struct {
		ID string `json:"id" jsonschema:"a VM's id or name, or an image's name"`
	}
	ExecIn struct {
		ID      string            `json:"id" jsonschema:"the VM's id or name"`
		Command string            `json:"command" jsonschema:"shell command to run (/bin/sh -c)"`
		Timeout int               `json:"timeout,omitempty" jsonschema:"seconds after which the command's process group is killed; none unless the user asked for a deadline"`
		Env     map[string]string `json:"env,omitempty" jsonschema:"environment variables for this command (over the VM's)"`
		Workdir string            `json:"workdir,omitempty" jsonschema:"working directory in the guest"`
		TraceID string            `json:"traceId,omitempty" jsonschema:"ties the command to what it causes: its exec_events row and the net_events and model_calls rows of the connections its processes make carry it (letters, digits, . _ : -; at most 128)"`
	}
	ResumeIn struct {
		Name string `json:"name" jsonschema:"the stopped or suspended VM's name (or id)"`
		Boot bool   `json:"boot,omitempty" jsonschema:"for a suspended VM: discard its saved state and boot its disk instead (when its state cannot be restored)"`
	}
	PersistIn struct {
		ID   string `json:"id" jsonschema:"the running ephemeral VM's id"`
		Name string `json:"name" jsonschema:"the name it keeps from now on"`
	}
	PurgeIn struct {
		All bool `json:"all,omitempty" jsonschema:"also remove persistent (named) VMs"`
	}
	ReadFileIn struct {
		ID       string `json:"id" jsonschema:"the VM's id or name"`
		Path     string `json:"path" jsonschema:"absolute path in the guest"`
		Encoding string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64 for binary files"`
	}
	WriteFileIn struct {
		ID       string `json:"id" jsonschema:"the VM's id or name"`
		Path     string `json:"path" jsonschema:"absolute path in the guest; missing directories are created"`
		Content  string `json:"content" jsonschema:"the file's content"`
		Encoding string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64 (content is base64-encoded bytes)"`
		Mode     int    `json:"mode,omitempty" jsonschema:"permission bits as a number, e.g. 493 for 0755 (default 0644)"`
	}
	VMLogsIn struct {
		ID   string `json:"id" jsonschema:"the VM's id or name"`
		Grep string `json:"grep,omitempty" jsonschema:"keep only lines containing this text"`
		Tail int    `json:"tail,omitempty" jsonschema:"only the last N lines (default 200)"`
	}
	ServiceLogsIn struct {
		Grep string `json:"grep,omitempty" jsonschema:"keep only lines containing this text"`
		Tail int    `json:"tail,omitempty" jsonschema:"only the last N lines (default 200)"`
	}
	SchemaIn struct {
		ID string `json:"id,omitempty" jsonschema:"a VM's id or name (default: the schema every new VM gets)"`
	}
	InspectIn struct {
		ID      string `json:"id" jsonschema:"the VM's id or name"`
		SQL     string `json:"sql" jsonschema:"one read-only SQL statement on the VM's session.db"`
		MaxRows int    `json:"maxRows,omitempty" jsonschema:"at most this many rows (default 100, at most 10000)"`
	}
	VersionIn  struct{}
	TimelineIn struct {
		ID      string   `json:"id" jsonschema:"the VM's id or name"`
		TraceID string   `json:"traceId,omitempty" jsonschema:"only the events of this trace (the traceId given to capsem_exec: its command, and the MCP calls, connections and model calls it caused)"`
		Since   string   `json:"since,omitempty" jsonschema:"only events at or after this: an RFC 3339 time or a duration back from now (15m, 2h)"`
		Layers  []string `json:"layers,omitempty" jsonschema:"only these layers: exec, mcp, dns, net, model, fs (default: all)"`
		Limit   int      `json:"limit,omitempty" jsonschema:"at most this many events, the latest (default 200, at most 5000)"`
	}
)

// Outputs.
type (
	VMOut struct {
		ID           string      `json:"id"`
		Name         string      `json:"name,omitempty"`
		Persistent   bool        `json:"persistent"`
		Run          bool        `json:"run,omitempty" jsonschema:"the VM of a capsem_run or capsem run in progress: removed when its command ends"`
		State        api.VMState `json:"state" jsonschema:"booting, running, unresponsive (running, but its guest missed its heartbeat: commands fail until it answers again, see stateReason), stopped (persistent) or defunct (its process died: see lastLog)"`
		StateReason  string      `json:"stateReason,omitempty" jsonschema:"why an unresponsive VM is, and since when"`
		RAMMb        int         `json:"ramMb"`
		CPUCount     int         `json:"cpuCount"`
		Image        string      `json:"image"`
		Base         string      `json:"base,omitempty" jsonschema:"the VM's root: full or minimal"`
		WorkspaceDir string      `json:"workspaceDir,omitempty" jsonschema:"the host directory shared as its workspace, when one was given"`
		CreatedAt    string      `json:"createdAt"`
		StartedAt    string      `json:"startedAt,omitempty"`
		PID          int         `json:"pid,omitempty"`
		LastLog      string      `json:"lastLog,omitempty"`
		Accel        string      `json:"accel,omitempty" jsonschema:"kvm or tcg"`
		BootMs       int64       `json:"bootMs,omitempty"`
		// Workspace is what the running VM's workspace takes on the host.
		Workspace *WorkspaceOut `json:"workspace,omitempty" jsonschema:"what the running VM's workspace takes on the host, against its bound (the guest gets ENOSPC at either bound)"`
		Ports     []PortOut     `json:"ports,omitempty" jsonschema:"guest TCP ports published on the host: a connection to address:host reaches the guest's port guest"`
		Network   *NetworkOut   `json:"network,omitempty" jsonschema:"the running VM's network against its bounds"`
	}
	NetworkOut struct {
		OpenConnections int   `json:"openConnections"`
		PeakConnections int   `json:"peakConnections" jsonschema:"the most TCP connections open at once since the VM started"`
		ConnectionLimit int   `json:"connectionLimit"`
		RefusedAtLimit  int64 `json:"refusedAtLimit" jsonschema:"connections reset at SYN because the bound was reached"`
		QueriesDropped  int64 `json:"queriesDropped" jsonschema:"DNS queries dropped because too many were being resolved at once"`
	}
	PortOut struct {
		Address string `json:"address"`
		Host    int    `json:"host"`
		Guest   int    `json:"guest"`
	}
	WorkspaceOut struct {
		UsedBytes  int64 `json:"usedBytes"`
		LimitBytes int64 `json:"limitBytes"`
		Files      int64 `json:"files" jsonschema:"files, directories and links"`
		FilesLimit int64 `json:"filesLimit"`
	}
	ListOut struct {
		VMs    []VMOut    `json:"vms"`
		Images []ImageOut `json:"images" jsonschema:"images made by capsem_fork: templates for capsem_create {image}"`
	}
	ImageOut struct {
		Name        string   `json:"name"`
		Description string   `json:"description,omitempty"`
		SourceID    string   `json:"sourceId" jsonschema:"the VM it was forked from"`
		SourceName  string   `json:"sourceName,omitempty"`
		SourceState string   `json:"sourceState" jsonschema:"running or stopped when forked"`
		CreatedAt   string   `json:"createdAt"`
		Base        string   `json:"base"`
		RAMMb       int      `json:"ramMb"`
		CPUCount    int      `json:"cpuCount"`
		DiskBytes   int64    `json:"diskBytes" jsonschema:"the disk's size as the guest sees it"`
		SizeBytes   int64    `json:"sizeBytes" jsonschema:"what the image takes on the host: its disk's allocated blocks and its workspace's files"`
		Memory      bool     `json:"memory,omitempty" jsonschema:"the image holds a running VM's memory: its VMs resume with the source's processes running"`
		StateBytes  int64    `json:"stateBytes,omitempty" jsonschema:"the saved memory and CPU state's size"`
		ForkMs      int64    `json:"forkMs"`
		PausedMs    int64    `json:"pausedMs,omitempty" jsonschema:"how long the running source was paused for the copy"`
		UsedBy      []string `json:"usedBy,omitempty" jsonschema:"VMs made from it: it cannot be deleted while any remain"`
		Problem     string   `json:"problem,omitempty" jsonschema:"why no VM can be made from it now"`
	}
	ExecOut struct {
		Stdout          string `json:"stdout"`
		Stderr          string `json:"stderr"`
		ExitCode        int    `json:"exitCode"`
		Signal          int    `json:"signal,omitempty"`
		TimedOut        bool   `json:"timedOut,omitempty" jsonschema:"the timeout killed the command's process group"`
		StdoutTruncated bool   `json:"stdoutTruncated,omitempty"`
		StderrTruncated bool   `json:"stderrTruncated,omitempty"`
		DurationMs      int64  `json:"durationMs"`
	}
	PurgeOut struct {
		Removed []string `json:"removed"`
	}
	DeleteOut struct {
		Deleted string `json:"deleted"`
		Image   bool   `json:"image,omitempty" jsonschema:"what was deleted was an image"`
	}
	ReadFileOut struct {
		Content  string `json:"content"`
		Encoding string `json:"encoding"`
		Size     int    `json:"size"`
	}
	WriteFileOut struct {
		Path  string `json:"path"`
		Bytes int    `json:"bytes"`
	}
	LogsOut struct {
		Serial  string `json:"serial,omitempty" jsonschema:"the guest's console"`
		Process string `json:"process,omitempty" jsonschema:"the VM's host process (JSON lines)"`
		Service string `json:"service,omitempty" jsonschema:"the service (JSON lines)"`
	}
	SchemaOut struct {
		Tables []string `json:"tables"`
	}
	InspectOut struct {
		Columns     []string `json:"columns"`
		Rows        [][]any  `json:"rows" jsonschema:"each a number, a string (a blob in base64), null, or {cut: true, bytes, value} for a value cut to its first bytes"`
		Truncated   bool     `json:"truncated,omitempty" jsonschema:"the answer is not the whole result: rows were left out or cells cut"`
		TruncatedBy string   `json:"truncatedBy,omitempty" jsonschema:"the bound that left rows out: rows (maxRows) or bytes (the answer's size)"`
		CutCells    int      `json:"cutCells,omitempty" jsonschema:"how many cells were cut"`
	}
	TimelineOut struct {
		Events  []TimelineEventOut `json:"events" jsonschema:"in time order"`
		Omitted int64              `json:"omitted,omitempty" jsonschema:"earlier events that matched but were left out (past limit)"`
	}
	TimelineEventOut struct {
		TS      string `json:"ts"`
		Layer   string `json:"layer" jsonschema:"exec, mcp, dns, net, model or fs: the ledger table the row is in"`
		ID      int64  `json:"id" jsonschema:"the row's id in its table, for capsem_inspect"`
		TraceID string `json:"traceId,omitempty"`
		Summary string `json:"summary"`
	}
	VersionOut struct {
		MCPVersion       string `json:"mcpVersion"`
		ServiceVersion   string `json:"serviceVersion,omitempty"`
		ServiceReachable bool   `json:"serviceReachable"`
		Match            bool   `json:"match" jsonschema:"the service runs the same build as this MCP server"`
		Error            string `json:"error,omitempty"`
	}
)

func vmOut(v api.VM) VMOut {
	o := VMOut{ID: v.ID, Name: v.Name, Persistent: v.Persistent, Run: v.Run, State: v.State, RAMMb: v.RAMMB, CPUCount: v.CPUs, Image: v.Image, Base: v.Base, WorkspaceDir: v.Workspace,
		CreatedAt: v.CreatedAt.Format(time.RFC3339), PID: v.PID, LastLog: v.LastLog}
	if !v.StartedAt.IsZero() {
		o.StartedAt = v.StartedAt.Format(time.RFC3339)
	}
	// A running VM's own list has the ports added while it runs.
	ports := v.Ports
	if v.Process != nil {
		ports = v.Process.Ports
	}
	for _, m := range ports {
		m = m.Normalized()
		o.Ports = append(o.Ports, PortOut{Address: m.Address, Host: m.Host, Guest: m.Guest})
	}
	if v.Process != nil {
		o.Accel, o.BootMs, o.StateReason = v.Process.Accel, v.Process.BootTimings["total"], v.Process.StateReason
		if w := v.Process.Workspace; w != nil {
			o.Workspace = &WorkspaceOut{UsedBytes: w.UsedBytes, LimitBytes: w.LimitBytes, Files: w.Files, FilesLimit: w.FilesLimit}
		}
		if n := v.Process.Network; n != nil {
			o.Network = &NetworkOut{OpenConnections: n.OpenConnections, PeakConnections: n.PeakConnections, ConnectionLimit: n.ConnectionLimit,
				RefusedAtLimit: n.RefusedAtLimit, QueriesDropped: n.QueriesDropped}
		}
	}
	return o
}

func execOut(r api.ExecResult) ExecOut {
	return ExecOut{Stdout: r.Stdout, Stderr: r.Stderr, ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, DurationMs: r.DurationMS}
}

func timeoutMS(seconds int) (int64, error) {
	if seconds < 0 {
		return 0, fmt.Errorf("timeout %d: want a positive number of seconds, or none", seconds)
	}
	return int64(seconds) * 1000, nil
}

func yes() *bool { t := true; return &t }
func no() *bool  { f := false; return &f }

// Annotation sets.
var (
	readOnly    = &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, DestructiveHint: no(), OpenWorldHint: no()}
	creates     = &mcp.ToolAnnotations{DestructiveHint: no(), OpenWorldHint: no()}
	changes     = &mcp.ToolAnnotations{DestructiveHint: yes(), OpenWorldHint: no()}
	overwrites  = &mcp.ToolAnnotations{DestructiveHint: yes(), IdempotentHint: true, OpenWorldHint: no()}
	nondestruct = &mcp.ToolAnnotations{DestructiveHint: no(), OpenWorldHint: no()}
)

func (t *tools) register(s *mcp.Server) {
	createSchema, err := createInSchema()
	if err != nil {
		panic("hostmcp: " + err.Error()) // a setting of a type the schema cannot describe: a programming error
	}
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_create", Annotations: creates, InputSchema: createSchema, Description: "Boot a fresh VM and return it once it is ready for capsem_exec (seconds to tens of seconds). " +
		"A VM with a name is persistent (capsem_stop keeps its state for capsem_resume); without one it is ephemeral and removed when stopped. " +
		"ports publishes guest TCP ports on the host (loopback unless an address is given). " +
		"Refused with a clear error when the host has too little free memory, or a host port is taken."}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_run", Annotations: creates, Description: "One shot: boot a temporary VM, run one shell command in it, remove the VM, and return the command's stdout, stderr and exit code."}, t.run)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_list", Annotations: readOnly, Description: "List every VM: running, booting, stopped persistent ones and defunct ones."}, t.list)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_info", Annotations: readOnly, Description: "One VM's configuration and state: persistent or not, memory, CPUs, published ports, pid, accelerator and boot time when running, the last log lines when defunct."}, t.info)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_exec", Annotations: changes, Description: "Run a shell command in a running VM and return its stdout and stderr (apart, each up to 1 MiB, with a truncated flag), exit code and duration. " +
		"No timeout unless you give one; a timeout kills the command's process group and says so (timedOut). Cancelling the call kills the command."}, t.exec)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_stop", Annotations: changes, Description: "Stop a VM. A persistent (named) VM keeps its disk, workspace and ledger for capsem_resume; an ephemeral VM is destroyed."}, t.stop)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_resume", Annotations: nondestruct, Description: "Start a persistent VM again: a suspended one carries on where it was (its processes running, its clock corrected); a stopped one boots its disk, workspace and ledger as they were. " +
		"A suspended VM whose state cannot be restored says why; boot: true then discards that state and boots its disk."}, t.resume)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_suspend", Annotations: nondestruct, Description: "Suspend a running persistent VM: save its whole state (memory, processes, open files) in its session and stop it, freeing its memory; capsem_resume carries on from there. " +
		"Commands running through capsem_exec at that moment end; processes the VM runs itself (servers, background jobs) carry on at resume. Processes keep their working directories and open files in the workspace."}, t.suspend)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_persist", Annotations: nondestruct, Description: "Give a running ephemeral VM a name, which makes it persistent."}, t.persist)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_purge", Annotations: changes, Description: "Destroy every ephemeral VM; with all, every persistent VM too. Returns the ids removed."}, t.purge)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_read_file", Annotations: readOnly, Description: "Read a file in a running VM: text, or base64 with encoding base64 (a file that is not UTF-8 must be read so). Up to 64 MiB."}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_write_file", Annotations: overwrites, Description: "Write a file in a running VM (replacing it), creating missing directories: text, or bytes with encoding base64. Up to 64 MiB."}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_vm_logs", Annotations: readOnly, Description: "The tail of a VM's logs: the guest's serial console and the VM's host process. grep keeps matching lines; tail limits to the last N. Works on stopped and defunct VMs."}, t.vmLogs)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_service_logs", Annotations: readOnly, Description: "The tail of the capsem service's own log (JSON lines). grep keeps matching lines; tail limits to the last N."}, t.serviceLogs)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_host_logs", Annotations: readOnly, Description: "The tail of a host log of capsem's, by name: service (the capsem service) or mcp (this MCP server). " +
		"grep keeps matching lines, tail limits to the last N lines, maxBytes to the last bytes (whole lines). Only those names are taken, never a path."}, t.hostLogsTool)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_inspect_schema", Annotations: readOnly, Description: "The CREATE TABLE statements of session.db, the per-VM ledger capsem_inspect queries."}, t.schema)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_inspect", Annotations: readOnly, Description: "Run one read-only SQL statement on a VM's session.db (its ledger: mcp_calls, net_events, dns_events, exec_events, fs_events, model_calls) and return columns and rows. " +
		"Writes, ATTACH, extensions and pragmas that change anything are refused. The answer is bounded: at most maxRows rows, " +
		fmt.Sprintf("%d MiB of JSON in all (the rows past it are left out) and %d MiB per cell (fewer with many columns): ", api.MaxInspectAnswerBytes>>20, api.MaxInspectCellBytes>>20) +
		"a longer text or blob comes as {cut: true, bytes: its whole length, value: its first bytes}; truncated, truncatedBy and cutCells say what was left out. " +
		"Use substr() and length() to read a long value in parts. " +
		fmt.Sprintf("A query runs for at most %s, and one that needs more than %d MiB of memory fails with an error saying so.", api.InspectTimeout, api.MaxInspectMemoryBytes>>20)}, t.inspect)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_timeline", Annotations: readOnly, Description: "A VM's ledger as one stream in time order: its commands (exec), MCP calls (mcp), DNS queries (dns), connections and HTTP requests (net), model API calls (model) and file transfers (fs), each with a one-line summary and its row id for capsem_inspect. " +
		"Filter by traceId (the one given to capsem_exec ties a command to the MCP calls and connections it caused), since and layers; the latest events when more match than limit. Works on stopped VMs."}, t.timeline)
	t.registerMCPTools(s)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_panics", Annotations: readOnly, Description: "Go panics, fatal errors and crashes by a signal of capsem's own processes on this host (the service, capsem mcp, each VM's process and its MCP aggregator), found in their logs: " +
		"when, which process (and VM), the message, where it was raised and the goroutine's frames, home paths shown as ~. The latest first; since and limit filter."}, t.panics)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_triage", Annotations: readOnly, Description: "What went wrong lately, ranked: crashes of capsem's processes, error and warning records in their logs, the service's failed (5xx), refused (4xx) and slow (over 500 ms) requests; " +
		"with id, also that VM's refused connections and DNS queries, failed or denied MCP calls and failed commands from its ledger. Occurrences are grouped (count, first, last, one example) and ranked by severity, count and recency. Start here when something fails."}, t.triage)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_delete", Annotations: changes, Description: "Destroy a VM, running or not, and wipe all its state (disk, workspace, ledger); or, given an image's name, delete that image (refused while VMs made from it remain)."}, t.delete)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_fork", Annotations: nondestruct, Description: "Make a reusable template of a running or stopped VM: an image holding its disk (installed packages, files anywhere in the guest), its workspace and its settings. " +
		"A running VM is paused for the copy (its filesystems synced first) and runs on. Boot VMs from it with capsem_create {image: name}: each gets its own identity (host name, machine id, ledger) and its own copy of everything. " +
		"With memory: true the image also keeps the VM's memory and CPU state, and its VMs start with the source's processes running (the source is suspended for the copy and resumed: commands in flight through capsem_exec end). Returns the image with its size and the fork's duration."}, t.fork)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_version", Annotations: readOnly, Description: "This MCP server's version, the service's, and whether they match."}, t.versionTool)
}

func (t *tools) create(ctx context.Context, req *mcp.CallToolRequest, in CreateIn) (*mcp.CallToolResult, VMOut, error) {
	notify := progress(ctx, req, "creating the VM")
	stage := newStages(notify)
	stop := heartbeat(2*time.Second, stage.beat)
	v, err := t.svc.CreateStream(ctx, api.CreateRequest{Name: in.Name, Image: in.Image, VMConfig: in.VMConfig}, stage.next)
	stop()
	if err != nil {
		return nil, VMOut{}, err
	}
	notify("ready")
	return nil, vmOut(v), nil
}

func (t *tools) run(ctx context.Context, req *mcp.CallToolRequest, in RunIn) (*mcp.CallToolResult, ExecOut, error) {
	ms, err := timeoutMS(in.Timeout)
	if err != nil {
		return nil, ExecOut{}, err
	}
	if in.Command == "" {
		return nil, ExecOut{}, fmt.Errorf("command is empty")
	}
	// The service owns the VM: it removes it when the command ends, and
	// when this call goes away (cancelled, or capsem mcp itself killed).
	notify := progress(ctx, req, "creating a temporary VM")
	stage := newStages(notify)
	stop := heartbeat(2*time.Second, stage.beat)
	defer stop()
	var stdout, stderr api.ExecOutput
	var started time.Time
	ev, err := t.svc.RunStream(ctx, api.RunRequest{CreateRequest: api.CreateRequest{VMConfig: api.VMConfig{Base: in.Base}}, Exec: api.ExecRequest{Command: in.Command, TimeoutMS: ms, Env: in.Env}},
		api.RunEvents{Stage: stage.next, Ready: func(vm api.VM) {
			started = time.Now()
			stage.next("running the command in " + vm.ID)
		}}, &stdout, &stderr)
	if err != nil {
		return nil, ExecOut{}, err
	}
	return nil, execOut(api.ResultOf(ev, &stdout, &stderr, time.Since(started))), nil
}

func (t *tools) list(ctx context.Context, _ *mcp.CallToolRequest, _ ListIn) (*mcp.CallToolResult, ListOut, error) {
	vms, err := t.svc.List(ctx)
	if err != nil {
		return nil, ListOut{}, err
	}
	images, err := t.svc.Images(ctx)
	if err != nil {
		return nil, ListOut{}, err
	}
	out := ListOut{VMs: []VMOut{}, Images: []ImageOut{}}
	for _, v := range vms {
		out.VMs = append(out.VMs, vmOut(v))
	}
	for _, img := range images {
		out.Images = append(out.Images, imageOut(img))
	}
	return nil, out, nil
}

func imageOut(img api.Image) ImageOut {
	return ImageOut{Name: img.Name, Description: img.Description, SourceID: img.Source.ID, SourceName: img.Source.Name,
		SourceState: img.Source.State, CreatedAt: img.CreatedAt.Format(time.RFC3339), Base: img.Base,
		RAMMb: img.Config.RAMMB, CPUCount: img.Config.CPUs, DiskBytes: img.DiskBytes, SizeBytes: img.SizeBytes,
		ForkMs: img.ForkMS, PausedMs: img.PausedMS, UsedBy: img.UsedBy, Problem: img.Problem, Memory: img.Memory, StateBytes: img.StateBytes}
}

func (t *tools) fork(ctx context.Context, _ *mcp.CallToolRequest, in ForkIn) (*mcp.CallToolResult, ImageOut, error) {
	img, err := t.svc.Fork(ctx, in.ID, api.ForkRequest{Name: in.Name, Description: in.Description, Memory: in.Memory})
	if err != nil {
		return nil, ImageOut{}, err
	}
	return nil, imageOut(img), nil
}

func (t *tools) info(ctx context.Context, _ *mcp.CallToolRequest, in IDIn) (*mcp.CallToolResult, VMOut, error) {
	v, err := t.svc.Info(ctx, in.ID)
	return nil, vmOut(v), err
}

func (t *tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in ExecIn) (*mcp.CallToolResult, ExecOut, error) {
	ms, err := timeoutMS(in.Timeout)
	if err != nil {
		return nil, ExecOut{}, err
	}
	r, err := t.svc.Exec(ctx, in.ID, api.ExecRequest{Command: in.Command, TimeoutMS: ms, Env: in.Env, Cwd: in.Workdir, TraceID: in.TraceID})
	if err != nil {
		return nil, ExecOut{}, err
	}
	return nil, execOut(r), nil
}

func (t *tools) stop(ctx context.Context, _ *mcp.CallToolRequest, in IDIn) (*mcp.CallToolResult, VMOut, error) {
	v, err := t.svc.Stop(ctx, in.ID)
	return nil, vmOut(v), err
}

func (t *tools) resume(ctx context.Context, _ *mcp.CallToolRequest, in ResumeIn) (*mcp.CallToolResult, VMOut, error) {
	v, err := t.svc.Resume(ctx, in.Name, api.ResumeRequest{Boot: in.Boot})
	return nil, vmOut(v), err
}

func (t *tools) suspend(ctx context.Context, _ *mcp.CallToolRequest, in IDIn) (*mcp.CallToolResult, VMOut, error) {
	v, err := t.svc.Suspend(ctx, in.ID)
	return nil, vmOut(v), err
}

func (t *tools) persist(ctx context.Context, _ *mcp.CallToolRequest, in PersistIn) (*mcp.CallToolResult, VMOut, error) {
	v, err := t.svc.Persist(ctx, in.ID, in.Name)
	return nil, vmOut(v), err
}

func (t *tools) purge(ctx context.Context, _ *mcp.CallToolRequest, in PurgeIn) (*mcp.CallToolResult, PurgeOut, error) {
	r, err := t.svc.Purge(ctx, in.All)
	return nil, PurgeOut{Removed: r.Removed}, err
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileIn) (*mcp.CallToolResult, ReadFileOut, error) {
	r, err := t.svc.ReadFile(ctx, in.ID, api.ReadFileRequest{Path: in.Path, Encoding: in.Encoding})
	return nil, ReadFileOut{Content: r.Content, Encoding: r.Encoding, Size: r.Size}, err
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileIn) (*mcp.CallToolResult, WriteFileOut, error) {
	if in.Mode < 0 || in.Mode > 0o777 {
		return nil, WriteFileOut{}, fmt.Errorf("mode %d: want permission bits from 0 to 511 (0777)", in.Mode)
	}
	err := t.svc.WriteFile(ctx, in.ID, api.WriteFileRequest{Path: in.Path, Content: in.Content, Encoding: in.Encoding, Mode: uint32(in.Mode)})
	if err != nil {
		return nil, WriteFileOut{}, err
	}
	return nil, WriteFileOut{Path: in.Path, Bytes: len(in.Content)}, nil
}

func (t *tools) vmLogs(ctx context.Context, _ *mcp.CallToolRequest, in VMLogsIn) (*mcp.CallToolResult, LogsOut, error) {
	r, err := t.svc.Logs(ctx, in.ID, in.Tail, in.Grep)
	return nil, LogsOut{Serial: r.Serial, Process: r.Process}, err
}

func (t *tools) serviceLogs(ctx context.Context, _ *mcp.CallToolRequest, in ServiceLogsIn) (*mcp.CallToolResult, LogsOut, error) {
	r, err := t.svc.ServiceLogs(ctx, in.Tail, in.Grep)
	return nil, LogsOut{Service: r.Service}, err
}

func (t *tools) schema(ctx context.Context, _ *mcp.CallToolRequest, in SchemaIn) (*mcp.CallToolResult, SchemaOut, error) {
	r, err := t.svc.Schema(ctx, in.ID)
	return nil, SchemaOut{Tables: r.Tables}, err
}

func (t *tools) inspect(ctx context.Context, _ *mcp.CallToolRequest, in InspectIn) (*mcp.CallToolResult, InspectOut, error) {
	r, err := t.svc.Inspect(ctx, in.ID, api.InspectRequest{SQL: in.SQL, MaxRows: in.MaxRows})
	return nil, InspectOut{Columns: r.Columns, Rows: r.Rows, Truncated: r.Truncated, TruncatedBy: r.TruncatedBy, CutCells: r.CutCells}, err
}

func (t *tools) timeline(ctx context.Context, _ *mcp.CallToolRequest, in TimelineIn) (*mcp.CallToolResult, TimelineOut, error) {
	since, err := api.ParseSince(in.Since, time.Now())
	if err != nil {
		return nil, TimelineOut{}, err
	}
	r, err := t.svc.Timeline(ctx, in.ID, api.TimelineRequest{TraceID: in.TraceID, Since: since, Layers: in.Layers, Limit: in.Limit})
	if err != nil {
		return nil, TimelineOut{}, err
	}
	out := TimelineOut{Events: []TimelineEventOut{}, Omitted: r.Omitted}
	for _, e := range r.Events {
		out.Events = append(out.Events, TimelineEventOut{TS: e.Timestamp, Layer: e.Layer, ID: e.ID, TraceID: e.TraceID, Summary: e.Summary})
	}
	return nil, out, nil
}

func (t *tools) delete(ctx context.Context, _ *mcp.CallToolRequest, in DeleteIn) (*mcp.CallToolResult, DeleteOut, error) {
	err := t.svc.Delete(ctx, in.ID)
	var se *apiclient.StatusError
	if errors.As(err, &se) && se.Code == api.CodeNotFound {
		// Not a VM: an image of that name, if any (one namespace).
		if ierr := t.svc.DeleteImage(ctx, in.ID); ierr == nil {
			return nil, DeleteOut{Deleted: in.ID, Image: true}, nil
		} else if !errors.As(ierr, &se) || se.Code != api.CodeNotFound {
			return nil, DeleteOut{}, ierr
		}
		return nil, DeleteOut{}, fmt.Errorf("no VM or image is named %q", in.ID)
	}
	if err != nil {
		return nil, DeleteOut{}, err
	}
	return nil, DeleteOut{Deleted: in.ID}, nil
}

func (t *tools) versionTool(ctx context.Context, _ *mcp.CallToolRequest, _ VersionIn) (*mcp.CallToolResult, VersionOut, error) {
	out := VersionOut{MCPVersion: t.version}
	v, err := t.svc.Version(ctx)
	if err != nil {
		out.Error = err.Error()
		return nil, out, nil
	}
	out.ServiceVersion, out.ServiceReachable, out.Match = v.Version, true, v.Version == t.version
	return nil, out, nil
}
