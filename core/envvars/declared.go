package envvars

// The declarations: every CAPSEM_* variable capsem reads, once, and the
// registry that lists them in the order capsem env prints them.

// Where capsem keeps its files.
var (
	Home = declare(filePath, about{name: "CAPSEM_HOME", audience: User, readers: Host, passOn: true,
		meaning: "capsem's own directory: user.toml, the network CA, guest assets, package cache and run directory",
		unset:   "~/.capsem"})
	CacheDir = declare(filePath, about{name: "CAPSEM_CACHE_DIR", audience: User, readers: Host, passOn: true,
		meaning: "package cache (npm and the like) shared by the sandboxed MCP servers",
		unset:   "$CAPSEM_HOME/cache"})
	RunDir = declare(filePath, about{name: "CAPSEM_RUN_DIR", audience: User, readers: Host, passOn: true,
		meaning: "runtime state: the service's socket, lock and log, VM records and sessions (the accelerator verdict stays in $CAPSEM_HOME/run)",
		unset:   "$CAPSEM_HOME/run"})
	UDSPath = declare(filePath, about{name: "CAPSEM_UDS_PATH", audience: User, readers: Host, passOn: true,
		meaning: "the service's API socket",
		unset:   "service.sock in the run directory"})
	CorpConfig = declare(filePath, about{name: "CAPSEM_CORP_CONFIG", audience: User, readers: Host, passOn: true,
		meaning: "the corp policy file, which outranks user.toml; set but empty is an error (name an empty file for none)",
		unset:   "/etc/capsem/corp.toml"})
)

// How VMs run.
var (
	Accel = declare(accelerator, about{name: "CAPSEM_ACCEL", audience: User, readers: Host, passOn: true,
		meaning: "the VMs' accelerator when their spec names none: tcg skips the proof that KVM works, kvm fails when it does not",
		unset:   "KVM when proven to work on this host, else TCG"})
	BootState = declare(off, about{name: "CAPSEM_BOOT_STATE", audience: User, readers: Host, passOn: true,
		meaning: "off: every VM boots from scratch, and no saved boot is resumed or made",
		unset:   "VMs resume the saved boot of their configuration"})
	TCGCacheMiB = declare(mebibytes, about{name: "CAPSEM_TCG_CACHE_MIB", audience: User, readers: Host,
		meaning: "capsem service: the TCG translation cache of each VM run without KVM, in MiB (as --tcg-cache-mib)",
		unset:   "0, QEMU's default, which grows with the code the guest runs"})
	NoAutodetect = declare(flagBool, about{name: "CAPSEM_NO_AUTODETECT", audience: User, readers: Host,
		meaning: "capsem service: keep the mcpServers of Claude Code and Gemini CLI settings out of the VMs' gateways",
		unset:   "false"})
	LogLevel = declare(level, about{name: "CAPSEM_LOG_LEVEL", audience: User, readers: Host | Guest | Sandboxed, passOn: true,
		meaning: "log level of capsem and of the capsem processes it starts (--log-level wins)",
		unset:   "info"})
)

// The MCP gateway of capsem gateway (the per-VM gateways read them too, but
// the service does not pass them on).
var (
	MCPDefaultTimeout = declare(seconds, about{name: "CAPSEM_MCP_DEFAULT_TIMEOUT_SECS", audience: User, readers: Host,
		meaning: "capsem gateway: deadline of every method but tools/call, in seconds",
		unset:   "[mcp.timeouts] default_secs"})
	MCPToolCallTimeout = declare(seconds, about{name: "CAPSEM_MCP_TOOL_CALL_TIMEOUT_SECS", audience: User, readers: Host,
		meaning: "capsem gateway: deadline of tools/call, in seconds",
		unset:   "[mcp.timeouts] tool_call_secs"})
	MCPToolTimeouts = declare(toolSeconds, about{name: "CAPSEM_MCP_TOOL_TIMEOUTS", audience: User, readers: Host,
		meaning: "capsem gateway: deadlines of single tools, server__tool=seconds,... (each replaces its [mcp.timeouts] tools entry)",
		unset:   "[mcp.timeouts] tools"})
	MCPInflight = declare(count, about{name: "CAPSEM_MCP_INFLIGHT", audience: User, readers: Host,
		meaning: "capsem gateway: most requests dispatched at once, across all connections",
		unset:   "max(32, 8 per CPU)"})
	MCPEndpoint = declare(unixEndpoint, about{name: "CAPSEM_MCP_ENDPOINT", audience: User, readers: Host | Guest,
		meaning: "capsem-mcp-server (the MCP relay): the gateway to reach, unix:PATH",
		unset:   "the guest channel, inside a VM"})
)

// Developer aids.
var (
	GuestBinary = declare(filePath, about{name: "CAPSEM_GUEST_BINARY", audience: User, readers: Host,
		meaning: "capsem image build: the CGO-free capsem build that becomes the guest's /init (as --guest-binary)",
		unset:   "capsem-guest next to this executable"})
	CPUProfile = declare(filePath, about{name: "CAPSEM_CPUPROFILE", audience: User, readers: Host | Guest,
		meaning: "developer aid: write a CPU profile of each capsem process that reads it to this file (make bench)",
		unset:   "no profile"})
)

// Between capsem processes.
var (
	ParentPID = declare(pid, about{name: "CAPSEM_PARENT_PID", audience: Internal, readers: Sandboxed,
		meaning: "privsep: the parent's pid, so that the first stage exits when its parent died before the parent-death signal was armed"})
	Sandbox = declare(list, about{name: "CAPSEM_SANDBOX", audience: Internal, readers: Sandboxed,
		meaning: "privsep: the mechanisms applied to this sandboxed child (nnp, caps, landlock-v<ABI>, seccomp), for information"})
	PrivsepStage = declare(text, about{name: "CAPSEM_PRIVSEP_STAGE", audience: Internal, readers: Sandboxed,
		meaning: "privsep: marks the first stage of a sandboxed child (only privsep.Command sets it)"})
	PrivsepPolicy = declare(text, about{name: "CAPSEM_PRIVSEP_POLICY", audience: Internal, readers: Sandboxed,
		meaning: "privsep: the encoded sandbox policy the first stage applies"})
	TraceID = declare(text, about{name: "CAPSEM_TRACE_ID", audience: Internal, readers: Guest,
		meaning: "the trace id of the exec that started a guest process; the agent attributes its connections by it"})
	DomainAllow = declare(list, about{name: "CAPSEM_DOMAIN_ALLOW", audience: Internal, readers: Sandboxed,
		meaning: "builtin tool server: hosts it may fetch from, from [mcp.builtin] domain_allow",
		unset:   "every host not blocked"})
	DomainBlock = declare(list, about{name: "CAPSEM_DOMAIN_BLOCK", audience: Internal, readers: Sandboxed,
		meaning: "builtin tool server: hosts it must not fetch from, from [mcp.builtin] domain_block"})
	HTTPMaxBodyBytes = declare(bodyBytes, about{name: "CAPSEM_HTTP_MAX_BODY_BYTES", audience: Internal, readers: Sandboxed,
		meaning: "builtin tool server: most bytes of a response body read, from [mcp.builtin] max_body_bytes",
		unset:   "10 MiB"})
	HTTPTimeout = declare(fractionalSeconds, about{name: "CAPSEM_HTTP_TIMEOUT_SECS", audience: Internal, readers: Sandboxed,
		meaning: "builtin tool server: deadline of one tool call's HTTP exchange, from [mcp.builtin] timeout_secs",
		unset:   "30 seconds"})
	HTTPAllowPrivate = declare(switch10, about{name: "CAPSEM_HTTP_ALLOW_PRIVATE", audience: Internal, readers: Sandboxed,
		meaning: "builtin tool server: may reach loopback, private and link-local addresses, from [mcp.builtin] allow_private_networks",
		unset:   "false"})
)

// For the tests.
var (
	TestBin = declare(filePath, about{name: "CAPSEM_TEST_BIN", audience: Test, readers: Host,
		meaning: "the capsem build under test (make test sets it)",
		unset:   "the test kit builds one"})
	TestHome = declare(filePath, about{name: "CAPSEM_TEST_HOME", audience: Test, readers: Host,
		meaning: "the CAPSEM_HOME the VM tests share: guest assets, saved boots and the accelerator verdict, made once",
		unset:   "<repository>/.tools/capsem-home"})
	EverythingPkg = declare(text, about{name: "CAPSEM_EVERYTHING_PKG", audience: Test, readers: Host,
		meaning: "npm spec of the MCP reference server (server-everything) the tests run",
		unset:   "the version the test kit pins"})
	AgentAllowNotPID1 = declare(flagBool, about{name: "CAPSEM_AGENT_ALLOW_NOT_PID1", audience: Test, readers: Guest,
		meaning: "the guest agent runs when it is not PID 1 (a test in a VM or container): it mounts what is missing and exits instead of powering off",
		unset:   "false"})
)

// registry lists every declaration above, in order (a test checks that
// none is missing).
var registry = []*Setting{
	Home.Setting, CacheDir.Setting, RunDir.Setting, UDSPath.Setting, CorpConfig.Setting,
	Accel.Setting, BootState.Setting, TCGCacheMiB.Setting, NoAutodetect.Setting, LogLevel.Setting,
	MCPDefaultTimeout.Setting, MCPToolCallTimeout.Setting, MCPToolTimeouts.Setting, MCPInflight.Setting, MCPEndpoint.Setting,
	GuestBinary.Setting, CPUProfile.Setting,
	ParentPID.Setting, Sandbox.Setting, PrivsepStage.Setting, PrivsepPolicy.Setting, TraceID.Setting,
	DomainAllow.Setting, DomainBlock.Setting, HTTPMaxBodyBytes.Setting, HTTPTimeout.Setting, HTTPAllowPrivate.Setting,
	TestBin.Setting, TestHome.Setting, EverythingPkg.Setting, AgentAllowNotPID1.Setting,
}
