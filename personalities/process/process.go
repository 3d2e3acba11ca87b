// Package process is `capsem process` (hidden): one VM's per-VM process,
// a thin command over core/vmhost, which owns the VM. The service (and
// capsem doctor's check VM) start it through vmhost.Launch.
package process

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/vmm/qemu"
)

// Cmd is `capsem process`.
type Cmd struct {
	vmhost.ProcessConfig `embed:""`
	ReadyFD              int  `name:"ready-fd" default:"-1" hidden:"" help:"Inherited file descriptor to write api.ReadyLine on, then close, once the API accepts connections (the parent waits on it instead of polling)."`
	ReadyStages          bool `name:"ready-stages" hidden:"" help:"Write the stages of the start on --ready-fd before the ready line (a parent that reads only the ready line does not ask)."`
}

// Run boots the VM and serves until it stops.
func (c *Cmd) Run(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.Default().With("vm", c.Name)
	// The network's link layer (gvisor-tap-vsock) logs through logrus,
	// unstructured and once per disconnect; what it reports reaches us as
	// errors, which core/vmhost logs.
	logrus.SetOutput(io.Discard)
	stage, notify := c.readiness(log) // before anything is started that could inherit the pipe
	// The launcher points stderr (this process's log, and a crash's) at
	// the session's process log: keep it bounded while the VM runs, since
	// a guest can make it write.
	if logPath := (paths.Session{Dir: c.SessionDir}).ProcessLog(); stderrIs(logPath) {
		go logs.RotateFD(logs.WithLogger(ctx, log), logPath, int(os.Stderr.Fd()), logs.ProcessLogMaxBytes, processLogCheck)
	}
	if err := c.ProcessConfig.Check(); err != nil {
		return fmt.Errorf("VM configuration: %w", err)
	}
	verdicts, err := paths.AccelVerdict()
	if err != nil {
		return err
	}
	v, err := vmhost.Boot(ctx, vmhost.Options{
		Backend:    &qemu.Backend{Log: log, VerdictPath: verdicts},
		Firmware:   qemu.PreferredFirmware(),
		SessionDir: c.SessionDir, APISocket: c.Socket, Name: c.Name, ID: c.ID, VMConfig: c.VM(), RootImage: c.RootImage,
		TCGCacheMiB: c.TCGCacheMiB, ConsoleLogMaxBytes: int64(c.ConsoleLogMaxKiB) << 10, GuestBinary: c.GuestBin, Logger: log,
		NoBootState: c.NoBootState, Suspended: c.Suspended, BootStateDir: c.BootStateDir, Stage: stage, NetLoopbackOnly: c.NetLoopbackOnly,
	})
	if err != nil {
		return err
	}
	v.ReloadOnSignal(ctx)
	return v.ServeAPI(ctx, c.Socket, notify)
}

// readiness returns what reports the start on --ready-fd: stage writes a
// stage line, and ready (what ServeAPI runs once the API listens) writes
// the readiness line and closes the descriptor. The descriptor is not for
// QEMU or the gateway's children (the parent must see the pipe close when
// this process dies), and it is used raw, not as an *os.File whose
// finalizer could close it early: on a failure it stays open until the
// process exits, after the error is written. Stages are written only when
// the parent asked for them (--ready-stages: an older parent reads the
// ready line alone), each line whole (shorter than a pipe's atomic write),
// and only before ready.
func (c *Cmd) readiness(log *slog.Logger) (stage func(string), ready func()) {
	// One page, less the ready line: the smallest pipe Linux gives (a
	// user over pipe-user-pages-soft) still holds every stage and the
	// ready line, so no stage write blocks the start.
	const maxStageBytes = 4096 - len(api.ReadyLine)
	if c.ReadyFD < 0 {
		return nil, func() {}
	}
	stages := c.ReadyStages
	fd := c.ReadyFD
	unix.CloseOnExec(fd)
	var mu sync.Mutex
	closed, staged := false, 0
	write := func(line string) {
		if _, err := unix.Write(fd, []byte(line)); err != nil {
			log.Warn("writing on the readiness pipe", "fd", fd, "err", err)
		}
	}
	stage = func(s string) {
		s = strings.Map(func(r rune) rune {
			if r < ' ' || r == 0x7f {
				return ' '
			}
			return r
		}, s)
		if limit := api.MaxStageLine - len(api.StagePrefix) - 1; len(s) > limit {
			s = strings.ToValidUTF8(s[:limit], "")
		}
		line := api.StagePrefix + s + "\n"
		mu.Lock()
		defer mu.Unlock()
		if stages && !closed && staged+len(line) <= maxStageBytes {
			staged += len(line)
			write(line)
		}
	}
	ready = func() {
		mu.Lock()
		defer mu.Unlock()
		write(api.ReadyLine)
		unix.Close(fd)
		closed = true
	}
	return stage, ready
}

// processLogCheck is how often the process log's size is looked at.
const processLogCheck = 2 * time.Second

// stderrIs reports whether this process's stderr is the file at path.
func stderrIs(path string) bool {
	st, err := os.Stderr.Stat()
	if err != nil {
		return false
	}
	other, err := os.Stat(path)
	return err == nil && os.SameFile(st, other)
}
