// Package doctor is `capsem doctor`: whether capsem will work on this host,
// and what to do when not. Each check prints one line (ok, warn or fail,
// what it found, and a fix for a warn or fail; core/doctor), `--json` the
// same as JSON lines, and the exit status is 1 when anything failed.
//
// Groups (`-k GROUP`, several allowed; all by default): accel (KVM present
// and proven, TCG), qemu (binary, machine type, devices), assets (the
// kernel, the minimal root and the root images in the store, and saved
// boots), storage ($CAPSEM_HOME, free space, mkfs.ext4,
// sparse files), sandbox (what privilege-separated children get on this
// kernel), config (policy files, auto-detected servers, capsem's own
// registration), gateway (a throwaway gateway and every configured server),
// service (whether the service serves and is this build, its run directory,
// its VMs) and vm (an ephemeral VM running the guest's capsem-doctor).
package doctor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/exitcode"
	"github.com/capsem/capsem/core/mcpgw"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm/qemu"
)

// Cmd is `capsem doctor`.
type Cmd struct {
	Groups       []string `short:"k" name:"group" help:"Check group to run (repeatable; default all): accel, qemu, assets, storage, sandbox, config, gateway, service, vm."`
	JSON         bool     `name:"json" help:"Print JSON lines: one per check, then a summary."`
	Config       string   `optional:"" type:"path" help:"Policy file to check in place of $CAPSEM_HOME/user.toml (corp.toml still applies)."`
	NoAutodetect bool     `help:"Leave out the mcpServers of Claude Code and Gemini CLI settings."`
	GuestBin     string   `name:"guest-binary" type:"path" hidden:"" help:"CGO-free capsem build for /init (default: capsem-guest next to this executable)."`
}

// Run runs the selected groups.
func (c *Cmd) Run(ctx context.Context) error {
	h, err := c.host()
	if err != nil {
		return err
	}
	groups, err := doctor.Select(h.groups(), c.Groups)
	if err != nil {
		return err
	}
	if doctor.Run(ctx, doctor.NewReporter(os.Stdout, c.JSON), groups).Result != "PASS" {
		return exitcode.Error{Code: 1}
	}
	return nil
}

// host is what the checks share: where things are, found once.
type host struct {
	cmd      *Cmd
	home     string
	self     string // this executable
	guestBin string

	assetsOnce sync.Once
	assets     *guestfs.Assets
	assetsErr  error
}

func (c *Cmd) host() (*host, error) {
	home, err := paths.Home()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("locating the capsem executable: %w", err)
	}
	guest := c.GuestBin
	if guest == "" {
		guest = filepath.Join(filepath.Dir(self), "capsem-guest")
	}
	return &host{cmd: c, home: home, self: self, guestBin: guest}, nil
}

func (h *host) assetsDir() string { return filepath.Join(h.home, "assets") }

// installedAssets is the kernel and minimal root for this capsem's guest
// binary in the store, unverified.
func (h *host) installedAssets() (*guestfs.Assets, error) {
	h.assetsOnce.Do(func() {
		h.assets, h.assetsErr = guestfs.Installed(guestfs.Options{Dir: h.assetsDir(), GuestBinary: h.guestBin})
	})
	return h.assets, h.assetsErr
}

// backend is the QEMU backend as a VM of this host gets it.
func (h *host) backend() (*qemu.Backend, error) {
	verdicts, err := paths.AccelVerdict()
	if err != nil {
		return nil, err
	}
	return &qemu.Backend{VerdictPath: verdicts}, nil
}

func (h *host) sources() (config.Sources, error) {
	return mcpgw.SourcesFor(h.cmd.Config, !h.cmd.NoAutodetect)
}

func (h *host) groups() []doctor.Group {
	return []doctor.Group{
		{Name: "accel", Hint: "see the qemu group; CAPSEM_ACCEL=tcg runs VMs without KVM", Checks: []doctor.Check{
			{Name: "kvm-device", Run: h.checkKVMDevice},
			{Name: "kvm-proven", Run: h.checkKVMProven},
			{Name: "tcg", Run: h.checkTCG},
		}},
		{Name: "qemu", Hint: "install qemu-system-x86 (apt-get install qemu-system-x86)", Checks: []doctor.Check{
			{Name: "binary", Run: h.checkQEMUBinary},
			{Name: "machine-q35", Run: h.checkMachine},
			{Name: "devices", Run: h.checkDevices},
			{Name: "firmware", Run: h.checkFirmware},
		}},
		{Name: "assets", Hint: "remove $CAPSEM_HOME/assets and run capsem image build", Checks: []doctor.Check{
			{Name: "present", Run: h.checkAssetsPresent},
			{Name: "hashes", Run: h.checkAssetHashes},
			{Name: "kernel", Run: h.checkKernel},
			{Name: "saved-boots", Run: h.checkSavedBoots},
			{Name: "root-image", Run: h.checkRootImage},
			{Name: "store", Run: h.checkStore},
		}},
		{Name: "storage", Hint: "check the permissions and free space of $CAPSEM_HOME's filesystem, or set CAPSEM_HOME elsewhere", Checks: []doctor.Check{
			{Name: "home-writable", Run: h.checkHomeWritable},
			{Name: "free-disk", Run: h.checkFreeDisk},
			{Name: "mkfs.ext4", Run: h.checkMkfs},
			{Name: "qemu-img", Run: h.checkQemuImg},
			{Name: "sparse-files", Run: h.checkSparse},
			{Name: "images", Run: h.checkImages},
		}},
		{Name: "sandbox", Hint: "capsem's sandboxed children need Linux 5.13+ with Landlock, seccomp filters and no_new_privs", Checks: []doctor.Check{
			{Name: "landlock", Run: checkLandlock},
			{Name: "seccomp", Run: checkSeccomp},
			{Name: "no-new-privs", Run: checkNoNewPrivs},
			{Name: "parent-death", Run: checkPdeathsig},
		}},
		{Name: "config", Hint: "fix the file named: unknown keys and bad values are refused", Checks: []doctor.Check{
			{Name: "policy", Run: h.checkPolicy},
			{Name: "autodetected", Run: h.checkAutodetected},
			{Name: "registration", Run: h.checkRegistration},
		}},
		{Name: "gateway", Hint: "run capsem gateway --log-level debug to see the gateway's own log", Checks: []doctor.Check{
			{Name: "gateway", Run: h.checkGateway},
		}},
		{Name: "service", Hint: "see capsem service status and capsem logs --service", Checks: []doctor.Check{
			{Name: "serving", Run: h.checkService},
			{Name: "run-dir", Run: h.checkRunDir},
			{Name: "vms", Run: h.checkVMs},
		}},
		{Name: "vm", Hint: "run capsem run -- true to see why a VM does not start", Checks: []doctor.Check{
			{Name: "guest-doctor", Run: h.checkVM},
		}},
	}
}
