// Package api holds the wire types and routes of Capsem's local HTTP APIs
// (JSON over HTTP/1.1 on 0600 Unix sockets; clients are in apiclient). The
// routes carry a version: a per-VM process may outlive an upgrade of the
// service that started it, so both ends name the version they speak.
//
// The per-VM process serves its API on paths.Session.APISocket.
package api

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/mcpframe"
)

// ExecRequest runs a command in the guest. Exactly one of Argv and Command is
// set; Command runs under /bin/sh -c.
type ExecRequest struct {
	Argv      []string          `json:"argv,omitempty"`
	Command   string            `json:"command,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"` // 0: no timeout
	// TraceID ties the command to what it causes: its exec_events row and
	// the rows of the connections its processes make carry it (the guest
	// gets it as envvars.TraceID, which child processes inherit).
	TraceID string `json:"trace_id,omitempty"`
}

// MaxTraceID bounds a trace id.
const MaxTraceID = mcpframe.MaxTraceID

// CheckTraceID refuses a trace id that is too long or holds anything but
// letters, digits and . _ : - ("" is none, and fine): the form the guest's
// relay carries it in (mcpframe.CheckTraceID).
func CheckTraceID(id string) error {
	if id == "" {
		return nil
	}
	if err := mcpframe.CheckTraceID(id); err != nil {
		return fmt.Errorf("trace_id: %w", err)
	}
	return nil
}

// Routes of the per-VM process API, version 1.
const (
	RouteInfo        = "/v1/info"          // GET: Info
	RouteExec        = "/v1/exec"          // POST ExecRequest: NDJSON ExecEvents
	RouteFileContent = "/v1/files/content" // GET ?path=&follow=1&max=&trace_id= (raw body, trailers); PUT ?path=&mode=&trace_id= (raw body)
	RouteFileStat    = "/v1/files/stat"    // POST FileRequest: FileResponse
	RouteFileMkdir   = "/v1/files/mkdir"   // POST FileRequest
	RouteStop        = "/v1/stop"          // POST: 204, then the VM stops
	RouteLogs        = "/v1/logs"          // GET ?tail=&grep=: the serial console's last lines
	RoutePorts       = "/v1/ports"         // POST PortMapping: the PortMapping as published
	RouteMCP         = "/v1/mcp"           // POST MCPCallRequest: MCPCallResult (through the gateway, as the host)
	RouteMCPServers  = "/v1/mcp/servers"   // GET: MCPServersResult
)

// The readiness pipe of `capsem process --ready-fd N`: a StagePrefix line
// for each stage of the start (checking or building the guest assets,
// deciding the accelerator, booting or resuming), then ReadyLine once the
// API accepts connections.
const (
	ReadyLine   = "ready\n"
	StagePrefix = "stage "
	// MaxStageLine bounds one line of the pipe.
	MaxStageLine = 512
	// StageAssets begins the stages of a guest asset build, the one part
	// of a start that may take minutes (a first VM's).
	StageAssets = "guest assets: "
	// StageRootImage prefixes the root image's build steps.
	StageRootImage = "root image: "
)

// StageLogLevel is the level a command line shows stage at: an asset
// build is worth telling; the other stages pass in a moment.
func StageLogLevel(stage string) slog.Level {
	if strings.HasPrefix(stage, StageAssets) || strings.HasPrefix(stage, StageRootImage) {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// ExecEvent is one line of the streamed exec response: output chunks, then
// exactly one final event with Done set (or Error). A run's stream starts
// with the stages of its VM's start, then an event carrying the VM once it
// is ready. A create's stream is stage events, then the VM (or Error).
type ExecEvent struct {
	Stage string `json:"stage,omitempty"`
	VM    *VM    `json:"vm,omitempty"`

	Stream string `json:"stream,omitempty"` // "stdout" | "stderr"
	Data   []byte `json:"data,omitempty"`   // base64 in JSON

	Done            bool   `json:"done,omitempty"`
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	StdoutBytes     int64  `json:"stdout_bytes,omitempty"`
	StderrBytes     int64  `json:"stderr_bytes,omitempty"`
	DurationMS      int64  `json:"duration_ms,omitempty"`
	ExecID          string `json:"exec_id,omitempty"`
	Error           string `json:"error,omitempty"`
	// Code is Error's code (Error.Code): the stream's 200 went with its
	// first event, so a failure after it says its kind here.
	Code string `json:"code,omitempty"`
}

// MaxFileBytes bounds one file read or write through the API: the guest
// protocol's limit. Files stream (GET and PUT files/content), so it bounds
// disk, not memory.
const MaxFileBytes = guestwire.MaxFileSize

// MaxJSONFileBytes bounds a file read or written as JSON (the service's
// files/read and files/write, capsem_read_file, capsem_write_file), which
// is held whole in memory: larger files go through files/content
// (capsem cp).
const MaxJSONFileBytes = 64 << 20

// Trailers of a file read streamed from GET files/content. A read that
// fails after its first byte has gone cannot change its status, so it ends
// with TrailerError set, and a client must check it; TrailerDigest is the
// SHA-256 (hex) of the bytes the guest sent, which the ledger records too.
const (
	TrailerError     = "Capsem-Error"
	TrailerErrorCode = "Capsem-Error-Code" // TrailerError's code (Error.Code)
	TrailerDigest    = "Capsem-Sha256"
)

// FileRequest stats or creates a directory in the guest. File contents
// travel as raw bodies of GET and PUT /files/content instead: as JSON they
// would be base64, a third larger, and decoded through more copies.
type FileRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode,omitempty"`
}

// FileResponse answers a FileRequest.
type FileResponse struct {
	Size    int64  `json:"size,omitempty"`
	Mode    uint32 `json:"mode,omitempty"`
	IsDir   bool   `json:"is_dir,omitempty"`
	ModTime int64  `json:"mod_time_unix,omitempty"`
}

// Info describes a running VM.
type Info struct {
	Name       string `json:"name"`
	PID        int    `json:"pid"`
	QEMUPID    int    `json:"qemu_pid"`
	SessionDir string `json:"session_dir"`
	Accel      string `json:"accel"`
	// AccelReason says why the VM runs under Accel (the KVM proof's
	// verdict, or what forced it).
	AccelReason string `json:"accel_reason,omitempty"`
	// Start says how the VM started: "restored" (resumed from the saved
	// boot of its configuration), "booted_saved" (the first of its
	// configuration: a boot was saved, then the VM resumed from it) or
	// "booted".
	Start       string           `json:"start,omitempty"`
	BootTimings map[string]int64 `json:"boot_timings_ms,omitempty"`
	// State is StateRunning, StateUnresponsive or StateStopped;
	// StateReason says why a VM is unresponsive, and since when.
	State       VMState `json:"state"`
	StateReason string  `json:"state_reason,omitempty"`
	// Workspace is what the guest's workspace takes on the host, and its
	// bound.
	Workspace *WorkspaceUsage `json:"workspace,omitempty"`
	// Ports are the ports the VM publishes on the host now: its
	// create's, and those port-forward added while it runs.
	Ports []PortMapping `json:"ports,omitempty"`
	// Network is the VM's network against its bounds; nil without one.
	Network *NetworkUsage `json:"network,omitempty"`
}

// NetworkUsage is a VM's network against its bounds: TCP connections open
// now, the most open at once since it started, the bound, and what the
// guest was refused for reaching a bound (connections reset at SYN, DNS
// queries dropped).
type NetworkUsage struct {
	OpenConnections int   `json:"open_connections"`
	PeakConnections int   `json:"peak_connections"`
	ConnectionLimit int   `json:"connection_limit"`
	RefusedAtLimit  int64 `json:"refused_at_limit"`
	QueriesDropped  int64 `json:"queries_dropped"`
}

// WorkspaceUsage is what a VM's workspace takes on the host against its
// bound: bytes of the host's disk (allocated blocks) and files
// (directories, links and nodes count as files). A guest that reaches
// either bound gets ENOSPC.
type WorkspaceUsage struct {
	UsedBytes  int64 `json:"used_bytes"`
	LimitBytes int64 `json:"limit_bytes"`
	Files      int64 `json:"files"`
	FilesLimit int64 `json:"files_limit"`
}

// Error is the body of a non-2xx response. Code names the kind of failure
// for programs (the CLI and capsem mcp tell people what to do from it);
// Error says what happened, in words.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
}

// Error codes (Error.Code), each with its HTTP status.
const (
	CodeBadRequest = "bad_request" // 400: the request is wrong; fix it
	CodeRefused    = "refused"     // 400: the guest refused it (no such file, not a directory)
	CodeNotFound   = "not_found"   // 404: no such VM
	CodeConflict   = "conflict"    // 409: the VM's state does not allow it (a name taken, not stopped)
	// CodeInterrupted (409): the VM was stopped or removed while the call
	// ran, which ended it; nothing is wrong with the call itself.
	CodeInterrupted = "interrupted"
	CodeTooLarge    = "too_large"   // 413
	CodeNoSpace     = "no_space"    // 507: the guest's file system is full
	CodeUnavailable = "unavailable" // 503: the VM is not running, or its guest stopped answering (it may have crashed: see capsem logs)
	CodeInternal    = "internal"    // 500
)

// StatusOfCode is the status of a code (500 for one it does not know): a
// failure reported after a stream's 200 (ExecEvent.Code,
// TrailerErrorCode) has the status it would have had.
func StatusOfCode(code string) int {
	switch code {
	case CodeBadRequest, CodeRefused:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict, CodeInterrupted:
		return http.StatusConflict
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeNoSpace:
		return http.StatusInsufficientStorage
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// CodeOf is the default code of a status.
func CodeOf(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return CodeBadRequest
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusInsufficientStorage:
		return CodeNoSpace
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	default:
		return CodeInternal
	}
}

// RouteTerminal opens an interactive terminal in the guest (POST
// TermRequest, answered 101 Switching Protocols; the connection then
// carries the terminal stream of guestwire's TermDataKind, TermResizeKind
// and TermExitKind frames).
const RouteTerminal = "/v1/terminal"

// TermUpgrade is the Upgrade token of a terminal connection.
const TermUpgrade = "capsem-terminal"

// TermRequest opens a terminal: the program (default a login shell), its
// environment additions, working directory and window size.
type TermRequest struct {
	Argv []string          `json:"argv,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	Rows uint16            `json:"rows,omitempty"`
	Cols uint16            `json:"cols,omitempty"`
}
