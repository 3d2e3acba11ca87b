// Package guestwire holds the messages of the guest control protocol: the
// host (per-VM process) and the guest agent (PID 1 in the VM) exchange them
// on logical port 5000 as frames of [u32 BE length][msgpack]. Bulk data
// travels beside it on port 5005, one stream per exec output (stdout or
// stderr) and one per file transfer, each starting with a StreamHeader frame
// followed by raw bytes until EOF: no control frame ever carries a file, so
// neither end holds a file in memory and a transfer never holds up the
// control connection.
//
// Requests carry an ID chosen by their sender; the answer echoes it and may
// arrive out of order, so many requests (several execs at once) share one
// control stream. The guest speaks first: Hello, as soon as it connects.
//
// The msgp code in guestwire_gen.go is generated (make generate) and committed.
package guestwire

//go:generate go tool msgp -file guestwire.go -o guestwire_gen.go -tests=false

// ProtocolVersion is bumped on any incompatible change to these messages.
// The host refuses a guest whose Hello carries another version.
const ProtocolVersion = 2

// Message types (Message.Type). Host → guest requests: BootConfig, Exec,
// Cancel, FileRead, FileWrite, FileStat, Mkdir, Shutdown, Ping. Guest → host:
// Hello (unsolicited, first), and the answers OK, ExecResult, FileResult,
// Pong, Error.
const (
	TypeHello      = "hello"
	TypeBootConfig = "boot_config" // -> ok
	TypeExec       = "exec"        // -> exec_result (after both output streams closed)
	TypeCancel     = "cancel"      // Target: kill a running exec's process group -> ok
	TypeFileRead   = "file_read"   // file bytes on a data stream, then -> file_result{info, bytes}
	TypeFileWrite  = "file_write"  // file bytes from a data stream, then -> file_result{info, bytes}
	TypeFileStat   = "file_stat"   // -> file_result{info}
	TypeMkdir      = "mkdir"       // -> file_result{info}
	TypeShutdown   = "shutdown"    // -> ok, then sync, unmount, power off
	TypePing       = "ping"        // -> pong
	// TypeSuspend asks the agent to park -> ok: it ends its multiplexer
	// session (the port stays open), detaches the workspace, and waits on
	// the raw channel for WakeMarker and a wake, as a restored guest
	// does; the host then saves the VM's state and stops it. Commands
	// the agent is running for the host end with the session.
	TypeSuspend = "suspend"
	// TypeSync writes every filesystem's dirty data to its disk (sync(2))
	// -> ok: what the guest wrote is then in its disk files, for a copy.
	TypeSync = "sync"
	// TypeSocketOwner asks which process owns a TCP socket of the guest's
	// (Socket) -> socket_owner_result (Owner). The answer is the guest's
	// word: it attributes a connection, it decides nothing.
	TypeSocketOwner = "socket_owner"
	// TypeSavePoint and TypeWake are the wake handshake (see Wake):
	// raw frames on the channel before the multiplexer starts.
	TypeSavePoint  = "save_point" // guest -> host: nothing VM-specific has happened yet
	TypeWake       = "wake"       // host -> guest: carry on
	TypeOK         = "ok"
	TypeExecResult = "exec_result"
	TypeFileResult = "file_result"
	TypePong       = "pong"
	TypeError      = "error"
	// TypeSocketOwnerResult answers TypeSocketOwner.
	TypeSocketOwnerResult = "socket_owner_result"
)

// SocketQuery names a TCP connection as the guest sees it: its own port
// and the destination it connected to.
type SocketQuery struct {
	LocalPort  uint16 `msg:"local_port"`
	RemoteIP   string `msg:"remote_ip"`
	RemotePort uint16 `msg:"remote_port"`
}

// SocketOwner is the process that owns a socket; PID 0 when none was
// found (the socket closed, or no process holds it).
type SocketOwner struct {
	PID     int    `msg:"pid"`
	Process string `msg:"process,omitempty"`
	TraceID string `msg:"trace_id,omitempty"`
}

// Bounds shared by both ends. Each side checks them: the host to fail early
// with a clear error, the guest because it trusts nothing it is sent.
const (
	// MaxFileSize bounds one file read or write (64 GiB). Files stream, so
	// this bounds disk use, not memory.
	MaxFileSize = 64 << 30
	// MaxBootFileSize bounds one boot config file, which does travel in a
	// control frame.
	MaxBootFileSize = 1 << 20
	// MaxFrame bounds one control message: room for the largest exec
	// request or boot config, never a file's content.
	MaxFrame = 4 << 20
	// MaxFileTransfers bounds the file transfers the guest serves at once;
	// the host queues its own below this.
	MaxFileTransfers = 8
	// MinOutputCap is the default and the minimum of Exec.StdoutCap and
	// Exec.StderrCap (10 MiB each): a smaller value is raised to it.
	MinOutputCap = 10 << 20
	// MaxOutputCap bounds what a caller may ask to be forwarded per output.
	MaxOutputCap = 1 << 30
	// MaxEnvVars, MaxEnvKey and MaxEnvValue bound an environment (boot config
	// or exec).
	MaxEnvVars  = 256
	MaxEnvKey   = 256
	MaxEnvValue = 128 << 10
	// MaxBootFiles bounds BootConfig.Files (their bytes are bounded by MaxFrame).
	MaxBootFiles = 64
	// MaxPath bounds a path (Linux PATH_MAX).
	MaxPath = 4096
	// MaxArgv bounds Exec.Argv entries; their bytes are bounded by MaxFrame.
	MaxArgv = 4096
	// MaxHostname is the Linux limit (HOST_NAME_MAX).
	MaxHostname = 64
	// MaxVMID bounds BootConfig.VMID.
	MaxVMID = 64
)

// Error codes (Error.Code). Callers can branch on them; Message says what
// went wrong in words that name the problem (the path, the key, the limit).
const (
	CodeInvalid    = "invalid"     // malformed request: bad path, blocked env key, bad argv
	CodeNotFound   = "not_found"   // no such file, directory or executable
	CodeExists     = "exists"      // already exists (mkdir without parents on a file, …)
	CodeSymlink    = "symlink"     // a symbolic link where following one is refused
	CodeTooLarge   = "too_large"   // a size bound was exceeded
	CodePermission = "permission"  // EACCES / EPERM / read-only file system
	CodeNotDir     = "not_dir"     // a path component is not a directory
	CodeIsDir      = "is_dir"      // a file operation on a directory
	CodeNotRegular = "not_regular" // a read of a device, FIFO or socket
	CodeBusy       = "busy"        // too many requests in flight, or a duplicate exec id
	CodeNoSpace    = "no_space"    // the file system (or its quota) is full
	CodeIO         = "io"          // any other I/O failure
	CodeUnknown    = "unknown"     // unknown message type
	CodeDecode     = "decode"      // the frame did not decode
)

// Message is one control frame. Type says which payload field is set.
type Message struct {
	Type string `msg:"type"`
	// ID is chosen by the requester (unique among its requests in flight)
	// and echoed by the answer. Hello uses 0; an Error with ID 0 answers a
	// frame whose ID could not be read.
	ID uint64 `msg:"id"`

	Hello      *Hello       `msg:"hello,omitempty"`
	BootConfig *BootConfig  `msg:"boot_config,omitempty"`
	Exec       *Exec        `msg:"exec,omitempty"`
	ExecResult *ExecResult  `msg:"exec_result,omitempty"`
	File       *FileRequest `msg:"file,omitempty"` // file_read, file_write, file_stat, mkdir
	FileResult *FileResult  `msg:"file_result,omitempty"`
	Error      *Error       `msg:"error,omitempty"`
	Wake       *Wake        `msg:"wake,omitempty"`
	Socket     *SocketQuery `msg:"socket,omitempty"`
	Owner      *SocketOwner `msg:"owner,omitempty"`
	Suspend    *Suspend     `msg:"suspend,omitempty"`
	// Target is the exec ID (Exec.StreamID) a Cancel applies to.
	Target uint64 `msg:"target,omitempty"`
}

// Hello is the guest's first message on a new control connection.
type Hello struct {
	ProtocolVersion int    `msg:"protocol_version"`
	AgentVersion    string `msg:"agent_version"`
	KernelRelease   string `msg:"kernel_release,omitempty"`
	// Boot-stage timings in milliseconds.
	Boot BootTimings `msg:"boot"`
}

// BootTimings are the guest's boot stages, in milliseconds. KernelToInit is
// the kernel's uptime when the agent started; the others are the agent's
// own stages, in the order it runs them.
type BootTimings struct {
	KernelToInitMS int64 `msg:"kernel_to_init_ms"`
	MountsMS       int64 `msg:"mounts_ms"`
	ModulesMS      int64 `msg:"modules_ms"`
	// StorageMS is finding and mounting the per-VM disk, switching the
	// root to the overlay on it and mounting the workspace; omitted (0)
	// when the VM has neither, so older peers decode it unchanged.
	StorageMS int64 `msg:"storage_ms,omitempty"`
	ChannelMS int64 `msg:"channel_ms"`
	// AfterWakeMS is the wake handshake's end → the control connection:
	// the part of the boot a VM resumed from a saved state runs itself (the
	// stages above are then the saved boot's). Omitted without the
	// handshake.
	AfterWakeMS int64 `msg:"after_wake_ms,omitempty"`
}

// Wake ends the wake handshake. With capsem.wake=1 on its command line the
// agent, once its modules are loaded and its devices found but before it
// mounts the per-VM disk or starts the multiplexer, writes a save_point
// frame on the raw channel and waits for a wake frame. In between the host
// may save the VM's state; a VM restored from that state resumes inside the
// same wait, so the wake is also the first thing every restored VM learns:
// fresh entropy (every restored VM starts with the same random state) and
// the time (the saved one is stale).
type Wake struct {
	// ClockUnixNano sets the guest's wall clock (0 = leave it alone).
	ClockUnixNano int64 `msg:"clock_unix_nano"`
	// Seed is mixed into the guest kernel's entropy pool, and the kernel's
	// generator reseeded from it, before anything else runs.
	Seed []byte `msg:"seed"`
}

// WakeMarker precedes the wake frame on the raw channel of a VM resumed
// from a saved boot. A parked guest (a suspend's) waits for its own marker
// (Suspend.WakeMarker) instead, and skips whatever comes before it: bytes
// of the session that ended at the park may still sit in its buffers when
// the VM is restored.
const WakeMarker = "\x00\xffcapsem-wake-7f3a9c\xff\x00"

// Suspend is the request of a TypeSuspend. WakeMarker is fresh for each
// suspend and known only to the host and this guest: the host's data that
// reaches the guest while it parks (an MCP server's answer, a file) cannot
// hold it, so nothing but the restored VM's wake can end the wait.
type Suspend struct {
	WakeMarker []byte `msg:"wake_marker"`
}

// Bounds of Suspend.WakeMarker.
const (
	MinWakeMarker = 16
	MaxWakeMarker = 64
)

// ValidateSuspend reports what is wrong with a suspend request.
func ValidateSuspend(s *Suspend) error {
	if s == nil {
		return Errorf(CodeInvalid, "suspend message has no suspend payload")
	}
	if len(s.WakeMarker) < MinWakeMarker || len(s.WakeMarker) > MaxWakeMarker {
		return Errorf(CodeInvalid, "suspend wake marker of %d bytes: want %d to %d", len(s.WakeMarker), MinWakeMarker, MaxWakeMarker)
	}
	return nil
}

// Wake seed bounds: at least a full reseed's worth (256 bits).
const (
	MinWakeSeed = 32
	MaxWakeSeed = 512
)

// BootConfig is sent by the host once after Hello, before any exec.
type BootConfig struct {
	// Env is added to every exec's environment (an exec's own Env wins).
	// Keys are checked with ValidateEnv.
	Env   map[string]string `msg:"env,omitempty"`
	Files []BootFile        `msg:"files,omitempty"`
	// ClockUnixNano sets the guest's wall clock (0 = leave it alone).
	ClockUnixNano int64 `msg:"clock_unix_nano,omitempty"`
	// Hostname sets the guest's host name ("" = leave it alone).
	Hostname string `msg:"hostname,omitempty"`
	// VMID is the host's id of this VM ("" = none). A root that carries
	// another VM's id was cloned from it (a VM made from a fork's image):
	// the agent then gives it the identity of its own a clone must not
	// share (the machine id), and records this id.
	VMID string `msg:"vm_id,omitempty"`
	// TrustCA is a CA certificate (PEM) the guest's programs must trust:
	// the agent writes it to GuestCAFile, and GuestCABundle (the system
	// roots and it) becomes the bundle TLS clients are pointed at.
	TrustCA []byte `msg:"trust_ca,omitempty"`
	// ExtraRoots are more CA certificates (PEM) the guest's TLS clients
	// trust, as the host does (a proxy's CA): the agent adds them to the
	// distribution's bundle and to GuestCABundle.
	ExtraRoots []byte `msg:"extra_roots,omitempty"`
}

// BootFile is a file the guest writes at boot (parents created, symlinks refused).
type BootFile struct {
	Path string `msg:"path"`
	Mode uint32 `msg:"mode"` // permission bits; 0 = 0644
	Data []byte `msg:"data"`
}

// Exec runs a command. Exactly one of Argv and Shell is set.
type Exec struct {
	// Argv is run directly; Argv[0] is looked up in the exec's PATH when it
	// has no slash.
	Argv []string `msg:"argv,omitempty"`
	// Shell is run as /bin/sh -c Shell.
	Shell string            `msg:"shell,omitempty"`
	Env   map[string]string `msg:"env,omitempty"`
	// Cwd is absolute; "" = the guest's default (/root when it exists).
	Cwd string `msg:"cwd,omitempty"`
	// TimeoutMS kills the whole process group when it expires (0 = none).
	TimeoutMS int64 `msg:"timeout_ms,omitempty"`
	// StdoutCap and StderrCap bound the bytes forwarded per output; past
	// them bytes are counted and dropped. 0 or less than MinOutputCap means
	// MinOutputCap; at most MaxOutputCap.
	StdoutCap int64 `msg:"stdout_cap,omitempty"`
	StderrCap int64 `msg:"stderr_cap,omitempty"`
	// StreamID names this exec in its output streams' headers and in a
	// Cancel (0 = the request ID). It must be unique among running execs.
	StreamID uint64 `msg:"stream_id,omitempty"`
}

// ExecResult answers an Exec once the process has exited and both of its
// output streams are closed.
type ExecResult struct {
	// ExitCode is the exit status, or 128+Signal when a signal ended it.
	ExitCode int `msg:"exit_code"`
	// Signal is the signal that ended the process (0 = it exited).
	Signal   int  `msg:"signal,omitempty"`
	TimedOut bool `msg:"timed_out,omitempty"`
	// Truncated flags an output that went past its cap.
	StdoutTruncated bool `msg:"stdout_truncated,omitempty"`
	StderrTruncated bool `msg:"stderr_truncated,omitempty"`
	// StdoutBytes and StderrBytes count everything the process wrote,
	// forwarded or not.
	StdoutBytes int64 `msg:"stdout_bytes"`
	StderrBytes int64 `msg:"stderr_bytes"`
	// StdoutSent and StderrSent count the bytes forwarded on the streams, so
	// the host can tell a complete stream from a cut one.
	StdoutSent int64 `msg:"stdout_sent"`
	StderrSent int64 `msg:"stderr_sent"`
	DurationMS int64 `msg:"duration_ms"`
	// Detached is set when the process exited but something it started kept
	// its output open past the guest's grace period; that output is then
	// drained and dropped in the guest.
	Detached bool `msg:"detached,omitempty"`
}

// FileRequest is the payload of file_read, file_write, file_stat and mkdir.
// Paths are absolute and may not contain "..".
type FileRequest struct {
	Path string `msg:"path"`
	// Mode is the permission bits for a created file or directory (0 = 0644
	// for files, 0755 for directories); for file_write it is also applied to
	// an existing file when non-zero.
	Mode uint32 `msg:"mode,omitempty"`
	// MaxSize bounds the bytes a read or write moves (0 = MaxFileSize; at
	// most MaxFileSize).
	MaxSize int64 `msg:"max_size,omitempty"`
	// Parents creates missing parent directories (file_write, mkdir) and
	// makes mkdir of an existing directory succeed.
	Parents bool `msg:"parents,omitempty"`
	// FollowSymlink lets file_read follow a symbolic link in the last path
	// component (refused by default). Writes never follow links anywhere.
	FollowSymlink bool `msg:"follow_symlink,omitempty"`
}

// FileResult answers a file request, after its data stream has ended.
type FileResult struct {
	Info *FileInfo `msg:"info,omitempty"`
	// Bytes is what the data stream carried (file_read, file_write): the
	// host checks it against what it sent or received, so a stream cut
	// short is never taken for a whole file.
	Bytes int64 `msg:"bytes,omitempty"`
}

// FileInfo describes a file without following a final symbolic link.
type FileInfo struct {
	// Mode is the Linux st_mode: type bits and permission bits.
	Mode          uint32 `msg:"mode"`
	Size          int64  `msg:"size"`
	ModTimeUnixNs int64  `msg:"mtime_unix_ns"`
	// LinkTarget is set for a symbolic link.
	LinkTarget string `msg:"link_target,omitempty"`
}

// Error answers any request that failed.
type Error struct {
	Code    string `msg:"code"`
	Message string `msg:"message"`
}

// StreamHeader opens every data stream on port 5005. The guest opens
// them all: for an exec's output and for a file transfer in either
// direction (a file_write's stream carries the host's bytes back to it).
type StreamHeader struct {
	// ID is the request the stream belongs to: the exec's or the file
	// request's Message.ID.
	ID    uint64 `msg:"id"`
	Which string `msg:"which"` // StreamStdout, StreamStderr or StreamFile
}

// What a data stream carries.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
	StreamFile   = "file"
)

// Header is the routing part of any Message. Reader decodes it alone from a
// frame whose full decode failed, so the answer can still reach its caller.
type Header struct {
	Type string `msg:"type"`
	ID   uint64 `msg:"id"`
}
