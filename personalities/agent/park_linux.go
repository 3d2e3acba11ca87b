package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
)

// ErrPark is returned by Serve after it acknowledged a Suspend request:
// the agent is to park (see guestwire.TypeSuspend).
var ErrPark = errors.New("agent: suspend requested by the host")

// parkablePort is the serial channel's port as a multiplexer session sees
// it: closing it ends the session (a read or write in progress returns at
// once) but leaves the port open, for the wake after a park and the next
// session.
//
// Once armed (before the agent acknowledges a suspend), it also watches
// what it reads for guestwire.WakeMarker: the host may save the VM before
// the session has ended, and then the restored VM's wake reaches the
// session's reader first. From the marker on, the bytes are kept for the
// wake (release) and the session ends; a partial marker at the end of a
// read is held back until the next read completes or refutes it.
type parkablePort struct {
	f      *os.File
	closed atomic.Bool
	armed  atomic.Bool
	marker string // the wake's, set before armed

	mu       sync.Mutex
	pending  []byte // read, not yet returned to the session
	held     []byte // a read's tail that may begin the marker
	leftover []byte // from the marker on: the wake's
}

func newParkablePort(f *os.File) *parkablePort { return &parkablePort{f: f} }

// arm makes the port watch for the wake's marker.
func (p *parkablePort) arm(marker []byte) {
	p.marker = string(marker)
	p.armed.Store(true)
}

func (p *parkablePort) Read(b []byte) (int, error) {
	p.mu.Lock()
	if len(p.pending) > 0 {
		n := copy(b, p.pending)
		p.pending = p.pending[n:]
		p.mu.Unlock()
		return n, nil
	}
	p.mu.Unlock()
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	if !p.armed.Load() {
		n, err := p.f.Read(b)
		if err != nil && p.closed.Load() {
			err = net.ErrClosed
		}
		return n, err
	}
	buf := make([]byte, max(len(b), 64))
	for {
		n, err := p.f.Read(buf)
		p.mu.Lock()
		data := append(p.held, buf[:n]...)
		p.held = nil
		if i := bytes.Index(data, []byte(p.marker)); i >= 0 {
			p.leftover = data[i:]
			p.pending = data[:i]
			p.closed.Store(true)
			p.mu.Unlock()
			if i == 0 {
				return 0, net.ErrClosed
			}
			return p.Read(b)
		}
		k := markerPrefixAtEnd(data, p.marker)
		p.held = bytes.Clone(data[len(data)-k:])
		p.pending = data[:len(data)-k]
		p.mu.Unlock()
		if len(p.pending) > 0 {
			return p.Read(b)
		}
		if err != nil {
			if p.closed.Load() {
				err = net.ErrClosed
			}
			return 0, err
		}
	}
}

// markerPrefixAtEnd is the length of the longest end of data that is a
// proper beginning of marker.
func markerPrefixAtEnd(data []byte, marker string) int {
	for k := min(len(data), len(marker)-1); k > 0; k-- {
		if string(data[len(data)-k:]) == marker[:k] {
			return k
		}
	}
	return 0
}

func (p *parkablePort) Write(b []byte) (int, error) {
	if p.closed.Load() {
		return 0, net.ErrClosed
	}
	n, err := p.f.Write(b)
	if err != nil && p.closed.Load() {
		err = net.ErrClosed
	}
	return n, err
}

// Close ends the session's use of the port: deadlines in the past wake a
// blocked read or write (the port is in the runtime's poller).
func (p *parkablePort) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	return p.f.SetDeadline(time.Unix(1, 0))
}

// release returns the port for the wake, with what was read of it from
// the marker on (held), its deadlines cleared. The session must have
// ended.
func (p *parkablePort) release() (held []byte, f *os.File, err error) {
	p.Close()
	if err := p.f.SetDeadline(time.Time{}); err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return append(p.held, p.leftover...), p.f, nil
}

// workspaceParkTimeout bounds a park's wait for the workspace's requests
// in flight to be answered.
const workspaceParkTimeout = 2 * time.Second

// parkWorkspace readies the workspace for a park before the agent
// acknowledges a suspend, while the host still runs: its relay holds the
// client's next requests once every one sent was answered, and lets the
// server's port go (no request may sit in the port's queue when the VM is
// saved, to reach the restored VM's new server as the start of its
// stream); after the wake, resumeWorkspace hands the client's fids to the
// new server, so processes keep their working directories and open files
// in the workspace. When the requests in flight are not answered in time,
// the workspace is detached instead (see detachWorkspace).
func parkWorkspace(log *slog.Logger, storage *storageStage) {
	if storage == nil || storage.workspace == nil {
		return
	}
	err := storage.workspace.Park(workspaceParkTimeout)
	if err == nil {
		storage.workspaceParked = true
		return
	}
	log.Warn("the workspace could not be parked; detaching it, to mount anew after the wake", "err", err)
	detachWorkspace(log, storage, err)
}

// detachWorkspace ends the workspace's mount and its relay (which frees the
// port for the next mount). A process whose working directory or open
// files are in the workspace keeps the detached mount, which answers no
// more.
func detachWorkspace(log *slog.Logger, storage *storageStage, why error) {
	if err := unix.Unmount(guestwire.GuestWorkspace, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		log.Warn("detaching the workspace", "err", err)
	}
	storage.workspace.End(why)
	storage.workspace, storage.workspaceParked, storage.workspaceDetached = nil, false, true
}

// resumeWorkspace hands a parked workspace's client to the restored VM's
// server, or, when that fails, detaches it to mount anew.
func resumeWorkspace(ctx context.Context, log *slog.Logger, storage *storageStage) {
	if storage == nil || !storage.workspaceParked {
		return
	}
	storage.workspaceParked = false
	ctx, cancel := context.WithTimeout(ctx, ChannelTimeout)
	defer cancel()
	port, err := guestchan.OpenVirtioPort(ctx, guestwire.WorkspacePort)
	if err == nil {
		if err = storage.workspace.Resume(port); err != nil {
			port.Close()
		}
	}
	if err != nil {
		log.Error("the workspace's files could not be handed to the new server; mounting it anew", "err", err)
		detachWorkspace(log, storage, err)
	}
}

// parkablePortOf is the parkablePort under ch's session, or nil when ch
// does not run on one (vsock).
func parkablePortOf(ch guestchan.Channel) *parkablePort {
	s, ok := ch.(*guestchan.Session)
	if !ok {
		return nil
	}
	p, _ := s.Conn().(*parkablePort)
	return p
}

// park is the guest's side of a suspend, after the multiplexer session on
// port has ended (and the workspace was parked, parkWorkspace): the agent
// waits on the raw port for the wake of a restored VM, applies it
// (entropy, clock), hands the workspace to the new server (or mounts it
// again), and starts a new session. The guest's processes run on
// throughout.
func park(ctx context.Context, log *slog.Logger, port *parkablePort, storage *storageStage) (*guestchan.Session, *parkablePort, error) {
	held, f, err := port.release()
	if err != nil {
		return nil, nil, fmt.Errorf("agent: taking the port back to park: %w", err)
	}
	var r io.Reader = f
	rest := bytes.NewReader(held)
	if len(held) > 0 {
		r = io.MultiReader(rest, f)
	}
	log.Info("parked: waiting for the wake")
	w, err := awaitWake(ctx, r, port.marker, systemWake)
	if err != nil {
		return nil, nil, err
	}
	log.Info("woken from a park", "clock_set", w.ClockUnixNano > 0, "seed_bytes", len(w.Seed))
	resumeWorkspace(ctx, log, storage)
	workspaceTag := ""
	if storage != nil && storage.workspaceDetached {
		workspaceTag = storage.plan.workspaceTag
	}
	if workspaceTag != "" {
		wctx, cancel := context.WithTimeout(ctx, ChannelTimeout)
		wport, err := mountWorkspace(wctx, log, workspaceTag, guestwire.GuestWorkspace)
		cancel()
		if err != nil {
			// The VM serves on without it; commands that need it say so.
			log.Error("mounting the workspace again after the park", "err", err)
		}
		storage.workspace, storage.workspaceDetached = wport, false
	}
	next := newParkablePort(f)
	// What was read past the wake is the new session's.
	next.pending, _ = io.ReadAll(rest)
	s, err := guestchan.Client(next, log)
	if err != nil {
		return nil, nil, err
	}
	return s, next, nil
}
