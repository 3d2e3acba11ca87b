// Package process is `capsem process` (hidden): one VM's per-VM process,
// a thin command over core/vmhost, which owns the VM. The service (and
// capsem doctor's check VM) start it through vmhost.Launch.
package process

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/vmm/qemu"
)

// Cmd is `capsem process`.
type Cmd struct {
	vmhost.ProcessConfig `embed:""`
	ReadyFD              int `name:"ready-fd" default:"-1" hidden:"" help:"Inherited file descriptor to write api.ReadyLine on, then close, once the API accepts connections (the parent waits on it instead of polling)."`
}

// Run boots the VM and serves until it stops.
func (c *Cmd) Run(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.Default().With("vm", c.Name)
	stage, notify := c.readiness(log) // before anything is started that could inherit the pipe
	verdicts, err := paths.AccelVerdict()
	if err != nil {
		return err
	}
	v, err := vmhost.Boot(ctx, vmhost.Options{
		Backend:    &qemu.Backend{Log: log, VerdictPath: verdicts},
		Firmware:   qemu.PreferredFirmware(),
		SessionDir: c.SessionDir, APISocket: c.Socket, Name: c.Name, ConfigPath: c.Config, NoAutodetect: c.NoAutodetect,
		CPUs: c.CPUs, MemoryMiB: c.MemoryMiB, TCGCacheMiB: c.TCGCacheMiB, GuestBinary: c.GuestBin, DiskGiB: c.DiskGiB, Logger: log,
		NoBootState: c.NoBootState, BootStateDir: c.BootStateDir, Stage: stage,
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
// process exits, after the error is written. Each line is written whole
// (shorter than a pipe's atomic write) and only before ready.
func (c *Cmd) readiness(log *slog.Logger) (stage func(string), ready func()) {
	const maxStageBytes = 32 << 10 // half of Linux's default pipe buffer
	if c.ReadyFD < 0 {
		return nil, func() {}
	}
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
		// Never more than a pipe holds: a parent that reads only at the
		// end still finds the ready line, and no stage blocks the start.
		if !closed && staged+len(line) <= maxStageBytes {
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
