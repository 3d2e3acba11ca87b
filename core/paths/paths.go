// Package paths is the one place that names Capsem's files on the host:
// the layout of $CAPSEM_HOME and of one VM's session directory. Every other
// package asks it instead of joining names of its own.
//
//	$CAPSEM_HOME (default ~/.capsem)
//	├── user.toml          the user's configuration
//	├── net-ca.pem         the guest network's CA, key included (0600, host only)
//	├── assets/            guestfs's store: the kernel, the minimal root, root images, saved boots
//	├── cache/             package cache of sandboxed MCP servers ($CAPSEM_CACHE_DIR)
//	└── run/               runtime state, 0700 ($CAPSEM_RUN_DIR)
//	    ├── service.sock   the service's API ($CAPSEM_UDS_PATH)
//	    ├── service.lock   held by the serving service
//	    ├── service.log    the service's log
//	    ├── mcp.log        capsem mcp's log
//	    ├── accel.json     the accelerator verdict (here even when $CAPSEM_RUN_DIR moves the rest)
//	    ├── scratch/       sandboxed children's homes
//	    ├── endpoints/     policy-reload sockets, one per MCP endpoint
//	    ├── vms/           the service's VM registry (core/vmrecord)
//	    └── sessions/<id>/ one VM's session directory (see Session)
package paths

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/capsem/capsem/core/envvars"
)

// Home is $CAPSEM_HOME, else ~/.capsem.
func Home() (string, error) {
	if h := envvars.Home.Get(); h != "" {
		return filepath.Abs(h)
	}
	u, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("locating the home directory (set CAPSEM_HOME): %w", err)
	}
	return filepath.Join(u, ".capsem"), nil
}

// homeJoin joins elem to Home.
func homeJoin(elem ...string) (string, error) {
	h, err := Home()
	if err != nil {
		return "", err
	}
	return filepath.Join(append([]string{h}, elem...)...), nil
}

// CacheDir is the package cache shared by sandboxed MCP servers:
// $CAPSEM_CACHE_DIR, else $CAPSEM_HOME/cache.
func CacheDir() (string, error) {
	if c := envvars.CacheDir.Get(); c != "" {
		return filepath.Abs(c)
	}
	return homeJoin("cache")
}

// AssetsDir holds the guest kernel and initramfs.
func AssetsDir() (string, error) { return homeJoin("assets") }

// NetCA is the per-install CA with which the guest's network terminates
// TLS for hosts with credentials: certificate and key, 0600 (core/netca).
func NetCA() (string, error) { return homeJoin("net-ca.pem") }

// UserConfig is the user's configuration file.
func UserConfig() (string, error) { return homeJoin("user.toml") }

// RunDir holds runtime state: $CAPSEM_RUN_DIR, else $CAPSEM_HOME/run.
func RunDir() (string, error) {
	if d := envvars.RunDir.Get(); d != "" {
		return filepath.Abs(d)
	}
	return homeJoin("run")
}

func runJoin(elem ...string) (string, error) {
	d, err := RunDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(append([]string{d}, elem...)...), nil
}

// ServiceSocket is the service's API socket: $CAPSEM_UDS_PATH, else
// service.sock in RunDir.
func ServiceSocket() (string, error) {
	if p := envvars.UDSPath.Get(); p != "" {
		return filepath.Abs(p)
	}
	return runJoin("service.sock")
}

// ServiceLock is held by the serving service, so that two never serve.
func ServiceLock() (string, error) { return runJoin("service.lock") }

// ServiceLog is the service's log (JSON lines).
func ServiceLog() (string, error) { return runJoin("service.log") }

// MCPLog is `capsem mcp`'s log (JSON lines).
func MCPLog() (string, error) { return runJoin("mcp.log") }

// ScratchRoot holds per-child scratch directories (HOME, TMPDIR).
func ScratchRoot() (string, error) { return runJoin("scratch") }

// AccelVerdict is the cached proof of whether KVM runs the guest on this
// host (vmm/qemu.Verdict). It is the host's, whichever run directory a
// service uses: always $CAPSEM_HOME/run/accel.json.
func AccelVerdict() (string, error) { return homeJoin("run", "accel.json") }

// EndpointsDir is where MCP endpoints register for policy reload.
func EndpointsDir() (string, error) { return runJoin("endpoints") }

// SessionsDir holds the session directories of VMs.
func SessionsDir() (string, error) { return runJoin("sessions") }

// RegistryDir holds the service's VM records.
func RegistryDir() (string, error) { return runJoin("vms") }

// ImagesDir holds the images forks make, one directory each.
func ImagesDir() (string, error) { return homeJoin("images") }

// Session is one VM's session directory and the files in it.
type Session struct{ Dir string }

// Names of the files in a session directory.
const (
	sessionDB     = "session.db"
	consoleLog    = "console.log"
	channelSocket = "channel.sock"
	apiSocket     = "process.sock"
	processLog    = "process.log"
	aggregatorLog = "mcp-aggregator.log"
	diskImage     = "disk.img"
	diskLayer     = "disk.qcow2"
	suspendDir    = "suspend"
	workspace     = "workspace"
)

// DB is the session's ledger.
func (s Session) DB() string { return filepath.Join(s.Dir, sessionDB) }

// ConsoleLog is the guest's serial console.
func (s Session) ConsoleLog() string { return filepath.Join(s.Dir, consoleLog) }

// ChannelSocket is QEMU's end of the guest channel.
func (s Session) ChannelSocket() string { return filepath.Join(s.Dir, channelSocket) }

// APISocket is the per-VM process's API.
func (s Session) APISocket() string { return filepath.Join(s.Dir, apiSocket) }

// ProcessLog is the per-VM process's log (JSON lines).
func (s Session) ProcessLog() string { return filepath.Join(s.Dir, processLog) }

// AggregatorLog is the MCP aggregator's log.
func (s Session) AggregatorLog() string { return filepath.Join(s.Dir, aggregatorLog) }

// Disk is the VM's disk image: ext4 with the root overlay's upper layer.
func (s Session) Disk() string { return filepath.Join(s.Dir, diskImage) }

// DiskLayer is the VM's disk when the VM was made from an image: a qcow2
// copy-on-write layer over the image's disk. A session has this or Disk,
// and the file's name is what says which format it has.
func (s Session) DiskLayer() string { return filepath.Join(s.Dir, diskLayer) }

// Suspend holds the state a suspend saved (RAM, CPUs, devices) and what
// the VM's process keeps for its resume (the DNS pins).
func (s Session) Suspend() string { return filepath.Join(s.Dir, suspendDir) }

// Workspace is the host side of the guest's /root/workspace.
func (s Session) Workspace() string { return filepath.Join(s.Dir, workspace) }
