// Package privsep starts Capsem's helper personalities (mcp-aggregator,
// mcp-builtin) and the external stdio MCP servers below them with as little
// authority as they need: an empty environment plus an allowlist, no
// capabilities, no_new_privs, a parent-death signal, their own process
// group, a Landlock filesystem ruleset and a small seccomp filter.
//
// # Two stages
//
// The capsem binary links cgo (go-sqlite3), so restricting every thread of a
// running Go process at once is not available (go-landlock's all-threads
// path needs libpsx, and the kernel's TSYNC flag needs Landlock ABI 8). The
// package therefore restricts one thread and lets execve spread it:
//
//   - The parent calls [Command]. The child is the same executable with the
//     allowlisted environment plus private variables: a stage marker, the
//     encoded sandbox policy and the parent's pid (envvars.ParentPID).
//   - The child calls [Enter] first thing in main. With the marker present it
//     locks its goroutine to its OS thread, and on that thread alone sets
//     no_new_privs, drops every capability (bounding set too, when it holds
//     CAP_SETPCAP), enforces the Landlock ruleset and the seccomp filter, and
//     then execs /proc/self/exe with the same argv and the private variables
//     removed. execve keeps only the calling thread, and the new image
//     inherits that thread's credentials, no_new_privs, Landlock domain and
//     seccomp filter, so every thread of the second stage, and every process
//     it starts, is restricted.
//
// Without the marker [Enter] does nothing, so it is safe to call in every
// personality.
//
// # Nesting
//
// A sandboxed process starts its own children with [Command] too, and each
// child gets a Landlock domain of its own nested below its parent's: the
// kernel intersects the two, so a child never gains what its parent lacks.
// Spec.Run names a program that is not capsem (an external stdio MCP
// server); the first stage, still the capsem executable, applies the
// restrictions and then execs it. Siblings in separate domains are walled
// off from each other and from their parent: Landlock lets a process
// ptrace-access (read /proc/<pid>/environ, mem, fd) only processes in its
// own domain or one nested below it, and with ABI 6 it scopes signals and
// abstract Unix sockets the same way. Each child also has its own scratch
// directory (its HOME), which no sibling's rules grant. What every process
// can read of another, /proc/<pid>/cmdline and stat, stays readable, so
// secrets belong in the environment, never in arguments.
//
// # Environment
//
// The child's environment is built from nothing. In order of precedence
// (later wins):
//
//  1. Names copied from the parent when set: [DefaultPassEnv] (USER,
//     LOGNAME, LANG, LANGUAGE, LC_*, TZ) and Spec.PassEnv (a trailing "*"
//     matches a prefix, e.g. "CAPSEM_MCP_*").
//  2. Fixed values: PATH=[SafePath], HOME and TMPDIR = Spec.Scratch, and
//     when Spec.CacheDir is set XDG_CACHE_HOME = CacheDir and
//     npm_config_cache = CacheDir/npm (so npx packages are fetched once, not
//     once per VM).
//  3. Spec.Env, e.g. a server's configured env (it may override PATH).
//
// After the first stage the child also sees envvars.Sandbox, which names the
// mechanisms that were applied (for diagnostics; it is not a security
// boundary). Names that steer the dynamic loader or a shell before any code
// runs (LD_*, BASH_ENV, ENV, BASH_FUNC_*) and the package's own variables are
// refused in Spec.Env and never copied by PassEnv.
//
// # Filesystem
//
// Landlock is an allowlist: everything not granted is denied, including the
// session directory, session.db and the service socket. Granted by default:
//
//   - read+execute: /usr, /bin, /sbin, /lib, /lib32, /lib64, /libx32, /opt
//     and the executable itself;
//   - read: a fixed list of non-secret /etc entries (loader cache, name
//     service and resolver files, passwd/group, time zone, CA certificates,
//     os-release, …), not /etc as a whole, because a root child without
//     capabilities still reads root-owned 0600 files such as /etc/shadow or
//     SSH host keys through plain DAC ownership; /proc (other processes'
//     sensitive entries stay closed because Landlock only lets a domain
//     ptrace-access processes inside it); /sys/devices/system/cpu,
//     /sys/devices/system/node, /sys/fs/cgroup and
//     /sys/kernel/mm/transparent_hugepage (CPU count and memory limits for
//     node and the Go runtime);
//   - read+write (and O_TRUNC, so "> /dev/null" works): /dev/null, /dev/zero,
//     /dev/full, /dev/random, /dev/urandom. No /dev/tty and no /dev/pts: the
//     children talk over pipes and must not reach (or inject into) a terminal;
//   - read/write/create: Spec.Scratch; read/write/create/execute:
//     Spec.CacheDir (npx and uvx run what they cached);
//   - Spec.ReadOnly (read), Spec.ReadWrite (read/write/create), Spec.Exec
//     (read+execute).
//
// Spec.Protect lists paths that must stay unreachable; [Command] refuses a
// policy whose grants contain or lie inside one of them.
//
// # Other kernel interfaces
//
// With Landlock ABI 6 and later the ruleset also scopes signals and abstract
// Unix sockets to the sandbox, so a root child cannot signal its (root)
// parent. Landlock mediates connect() to path-named Unix sockets only from
// ABI 9, so on older kernels a seccomp filter refuses socket(AF_UNIX, ...)
// with EACCES (socketpair stays allowed: node and libuv use it for child
// stdio). The filter always refuses io_uring_setup with ENOSYS, because
// io_uring operations bypass seccomp, and kills the process on a foreign
// syscall ABI (i386, x32). Network access is not restricted: the
// aggregator and builtin server need HTTP.
package privsep
