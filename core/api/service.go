package api

import (
	"net/url"
	"strings"
	"time"
)

// Routes of the service API, version 1. {vm} is a VM's name or id.
const (
	RouteVersion     = "/v1/version"              // GET: Version
	RouteVMs         = "/v1/vms"                  // GET: []VM; POST CreateRequest: VM
	RouteVMsLive     = "/v1/vms/stream"           // POST CreateRequest: the create stream (NDJSON ExecEvents: stages, then the VM)
	RouteRun         = "/v1/run"                  // POST RunRequest: ExecResult (an ephemeral VM, removed after)
	RouteRunLive     = "/v1/run/stream"           // POST RunRequest: the stages of the VM's start, the ready VM, then the exec stream; the VM is removed before the final event, or when the client goes away
	RoutePurge       = "/v1/purge"                // POST PurgeRequest: PurgeResult
	RouteServiceLogs = "/v1/service/logs"         // GET ?tail=&grep=: LogsResult
	RouteServiceStop = "/v1/service/stop"         // POST: 204, then the service exits (its VMs keep running)
	RouteSchema      = "/v1/inspect/schema"       // GET: SchemaResult of a new VM's ledger
	RouteVM          = "/v1/vms/{vm}"             // GET: VM; DELETE: 204
	RouteVMExec      = "/v1/vms/{vm}/exec"        // POST ExecRequest: ExecResult
	RouteVMExecLive  = "/v1/vms/{vm}/exec/stream" // POST ExecRequest: the exec stream (NDJSON ExecEvents)
	RouteVMTerminal  = "/v1/vms/{vm}/terminal"    // POST TermRequest: 101, then the terminal stream (see RouteTerminal)
	RouteVMStop      = "/v1/vms/{vm}/stop"        // POST: VM
	RouteVMResume    = "/v1/vms/{vm}/resume"      // POST: VM
	RouteVMPersist   = "/v1/vms/{vm}/persist"     // POST PersistRequest: VM
	RouteVMReadFile  = "/v1/vms/{vm}/files/read"  // POST ReadFileRequest: ReadFileResult (at most MaxJSONFileBytes)
	RouteVMWriteFile = "/v1/vms/{vm}/files/write" // POST WriteFileRequest: 204 (at most MaxJSONFileBytes)
	// RouteVMFileContent streams a file of any size (up to MaxFileBytes):
	// GET ?path=&follow=1&max= answers its bytes (FileStream: check the
	// trailers), PUT ?path=&mode= takes them as the body (204).
	RouteVMFileContent = "/v1/vms/{vm}/files/content"
	RouteVMLogs        = "/v1/vms/{vm}/logs"           // GET ?tail=&grep=: LogsResult
	RouteVMSchema      = "/v1/vms/{vm}/inspect/schema" // GET: SchemaResult
	RouteVMInspect     = "/v1/vms/{vm}/inspect"        // POST InspectRequest: InspectResult
	// RouteVMTimeline is a VM's ledger as one stream of events (GET
	// ?trace_id=&since=&layers=exec,mcp&limit=: TimelineResult; since is
	// an RFC 3339 time or a duration back from now).
	RouteVMTimeline = "/v1/vms/{vm}/timeline"
	// RouteVMMCP sends one MCP request through a running VM's gateway as
	// the host (POST MCPCallRequest: MCPCallResult); RouteVMMCPServers
	// lists its servers (GET: MCPServersResult).
	RouteVMMCP        = "/v1/vms/{vm}/mcp"
	RouteVMMCPServers = "/v1/vms/{vm}/mcp/servers"
	// RouteVMPorts publishes one more port of a running VM, for as long
	// as it runs (POST PortMapping: the PortMapping as published).
	RouteVMPorts = "/v1/vms/{vm}/ports"
)

// VMPath puts a VM's name or id into a route with {vm}.
func VMPath(route, vm string) string {
	return strings.Replace(route, "{vm}", url.PathEscape(vm), 1)
}

// VMState is where a VM is in its life. Which states each lifecycle verb
// accepts is declared once, by the service.
type VMState string

// States of a VM in the service.
const (
	StateBooting VMState = "booting"
	StateRunning VMState = "running"
	StateStopped VMState = "stopped" // persistent, not running: resume boots it again
	StateDefunct VMState = "defunct" // its process died; LastLog says how
	// StateSuspended: persistent, its whole state (RAM, processes) saved
	// in its session; resume carries on from it.
	StateSuspended VMState = "suspended"
	// StateUnresponsive: running, but its guest missed its heartbeat (a
	// fork bomb, a stall of the host); calls fail until it answers again,
	// which makes it running again by itself. Reported by the VM's
	// process (Info.StateReason says why), never recorded.
	StateUnresponsive VMState = "unresponsive"
)

// The roots a VM can have (CreateRequest.Base).
const (
	// BaseFull is Debian 12 with Node, Python, git and the AI CLIs,
	// wired to the gateway: a read-only image under the VM's own layer.
	BaseFull = "full"
	// BaseMinimal is busybox from the initramfs, for a VM that needs
	// nothing more.
	BaseMinimal = "minimal"
)

// CreateRequest creates a VM. A VM with a name is persistent: stopping it
// keeps its disk, workspace and session.db for resume. Without a name it
// is ephemeral, removed when it stops.
type CreateRequest struct {
	Name string `json:"name,omitempty"`
	// Image is "" or "default" (a fresh VM), or an image a fork made.
	Image string `json:"image,omitempty"`
	VMConfig
}

// VM is one VM as the service knows it.
type VM struct {
	ID         string `json:"id"`
	Name       string `json:"name,omitempty"`
	Persistent bool   `json:"persistent"`
	// Run says the VM belongs to a run: it is removed when the run's
	// command ends.
	Run        bool      `json:"run,omitempty"`
	State      VMState   `json:"state"`
	Image      string    `json:"image"`
	CreatedAt  time.Time `json:"created_at"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	PID        int       `json:"pid,omitempty"`
	SessionDir string    `json:"session_dir"`
	// VMConfig is the create request's with its defaults filled in;
	// NoAutodetect also when it is the service's own option. Its ports
	// are published at every start (those a running VM publishes now,
	// port-forward's too, are Process.Ports).
	VMConfig
	// LastLog holds the last lines of a defunct VM's process log.
	LastLog string `json:"last_log,omitempty"`
	// Process is the running VM's own report (accelerator, boot timings).
	Process *Info `json:"process,omitempty"`
}

// RunRequest runs one command in a fresh ephemeral VM, removed after.
// A name here only names the VM while it runs (its hostname, and a handle
// for exec or shell meanwhile): the VM stays ephemeral.
type RunRequest struct {
	CreateRequest
	Exec ExecRequest `json:"exec"`
}

// ExecResult is a finished command: its output apart, bounded.
type ExecResult struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	DurationMS      int64  `json:"duration_ms"`
}

// PersistRequest names an ephemeral VM, which makes it persistent.
type PersistRequest struct {
	Name string `json:"name"`
}

// PurgeRequest removes every ephemeral VM; All adds the persistent ones.
type PurgeRequest struct {
	All bool `json:"all,omitempty"`
}

// PurgeResult lists what was removed.
type PurgeResult struct {
	Removed []string `json:"removed"`
}

// ReadFileRequest reads a guest file. Encoding "base64" returns the bytes
// base64-encoded (for binary files); "" or "utf8" returns text, and a file
// that is not valid UTF-8 is an error naming base64.
//
// A symbolic link in the last path component is followed unless NoFollow
// (in the guest, where it can only reach the guest's own files).
type ReadFileRequest struct {
	Path     string `json:"path"`
	Encoding string `json:"encoding,omitempty"`
	NoFollow bool   `json:"no_follow,omitempty"`
}

// ReadFileResult is a file's content.
type ReadFileResult struct {
	Content  string `json:"content"`
	Encoding string `json:"encoding"` // utf8 | base64
	Size     int    `json:"size"`
}

// WriteFileRequest writes a guest file, creating its parent directories.
type WriteFileRequest struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty"` // "" or utf8 | base64
	Mode     uint32 `json:"mode,omitempty"`     // default 0644
}

// LogsResult is the tail of a log.
type LogsResult struct {
	Serial  string `json:"serial,omitempty"`  // the guest's console
	Process string `json:"process,omitempty"` // the per-VM process (JSON lines)
	Service string `json:"service,omitempty"` // the service (JSON lines)
}

// SchemaResult is the session ledger's schema.
type SchemaResult struct {
	Tables []string `json:"tables"` // CREATE TABLE statements
}

// Bounds on an inspect answer. The byte bounds count the answer's JSON.
const (
	DefaultInspectRows = 100
	MaxInspectRows     = 10000
	// MaxInspectCellBytes bounds one cell: a longer text or blob is cut to
	// its first bytes (a CutCell). With more than MaxInspectAnswerBytes /
	// MaxInspectCellBytes columns, a cell's bound is the answer's over
	// their number, so that any one row fits.
	MaxInspectCellBytes = 1 << 20
	// MaxInspectAnswerBytes bounds the answer: the rows past it are left
	// out (TruncatedBy "bytes"); the first row is always there.
	MaxInspectAnswerBytes = 8 << 20
	// MaxInspectMemoryBytes bounds what SQLite may allocate in the service
	// for inspect queries: one that needs more (SQLite builds every value
	// whole, wide ones too) fails with an error saying so.
	MaxInspectMemoryBytes = 96 << 20
	// InspectTimeout interrupts a query.
	InspectTimeout = 5 * time.Second
)

// InspectRequest runs one read-only SQL statement on the session ledger.
type InspectRequest struct {
	SQL     string `json:"sql"`
	MaxRows int    `json:"max_rows,omitempty"` // default DefaultInspectRows, at most MaxInspectRows
}

// InspectResult is a query's answer, bounded in rows, bytes and cells.
type InspectResult struct {
	Columns []string `json:"columns"`
	// Rows hold numbers, strings (text, or a blob in base64), nulls, and a
	// CutCell (a JSON object) for a value too long for a cell.
	Rows [][]any `json:"rows"`
	// Truncated: the answer is not the whole result: rows were left out
	// (TruncatedBy) or cells cut (CutCells).
	Truncated bool `json:"truncated,omitempty"`
	// TruncatedBy names the bound that left rows out: "rows" (max_rows) or
	// "bytes" (MaxInspectAnswerBytes).
	TruncatedBy string `json:"truncated_by,omitempty"`
	// CutCells counts the cells cut to a CutCell.
	CutCells int `json:"cut_cells,omitempty"`
}

// Why rows were left out of an InspectResult.
const (
	TruncatedByRows  = "rows"
	TruncatedByBytes = "bytes"
)

// CutCell stands in an InspectResult row for a text or blob value longer
// than a cell may hold: its first bytes, and its whole length.
type CutCell struct {
	Cut   bool  `json:"cut"`   // always true: what tells a CutCell from a value
	Bytes int64 `json:"bytes"` // the whole value's length in bytes
	// Value is its first bytes: a string for text, base64 for a blob.
	Value any `json:"value"`
}

// AsCutCell reads v, a cell of a decoded InspectResult, as a CutCell. A
// value from SQLite is never a JSON object, so any object is one.
func AsCutCell(v any) (CutCell, bool) {
	m, ok := v.(map[string]any)
	if !ok || m["cut"] != true {
		return CutCell{}, false
	}
	n, _ := m["bytes"].(float64)
	return CutCell{Cut: true, Bytes: int64(n), Value: m["value"]}, true
}

// Version is the service's build.
type Version struct {
	Version string `json:"version"`
	PID     int    `json:"pid"`
}
