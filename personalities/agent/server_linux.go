package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestwire"
)

// ErrShutdown is returned by Serve after it acknowledged a Shutdown request:
// the caller powers the VM off.
var ErrShutdown = errors.New("agent: shutdown requested by the host")

// DialFunc opens a stream to a logical port on the host (guestchan.Channel.Dial).
type DialFunc func(ctx context.Context, port uint32) (net.Conn, error)

// Server answers control requests on one connection. The zero value is not
// usable: set Dial and Reaper. A Server keeps the boot environment across
// connections, so a reconnect does not lose it.
type Server struct {
	Log *slog.Logger
	// Dial opens data streams (port 5005): exec output and file transfers.
	Dial DialFunc
	// Reaper starts and waits for every exec child.
	Reaper *Reaper
	// Hello is sent first on every connection (ProtocolVersion is filled in).
	Hello guestwire.Hello
	// BaseEnv is every exec's environment before the boot config's and the
	// exec's own (nil: DefaultEnv).
	BaseEnv map[string]string
	// DefaultCwd is the working directory of an exec that names none
	// ("": /root when it is a directory, else /).
	DefaultCwd string
	// MaxFileSize bounds file reads and writes (0: guestwire.MaxFileSize;
	// never more).
	MaxFileSize int64
	// OutputGrace is how long an exec's outputs may stay open after its
	// process exited (something it started in the background holds them)
	// before the result is sent without them (0: 2 s).
	OutputGrace time.Duration
	// MaxInFlight bounds requests handled at once (0: 256); past it a
	// request is answered "busy" at once.
	MaxInFlight int
	// SetClock and SetHostname apply the boot config; nil leaves the system
	// alone (tests run on a real host).
	SetClock    func(time.Time) error
	SetHostname func(string) error
	// ClaimIdentity makes the root this VM's (BootConfig.VMID); nil
	// leaves the system alone.
	ClaimIdentity func(vmID string) error
	// BeforePark readies the channel for a park (a suspend) that ends at
	// wakeMarker; nil: this agent cannot park.
	BeforePark func(wakeMarker []byte)
	// FactsPath, when set, is where the boot config's facts are recorded
	// (guestwire.GuestBootFacts in the VM).
	FactsPath string

	mu            sync.Mutex
	bootEnv       map[string]string
	execs         map[uint64]*runningExec
	transfers     int                           // file transfers in progress (startTransfer)
	transferStops map[uint64]context.CancelFunc // by request id, for cancel
}

// DefaultEnv is the environment an exec starts from.
func DefaultEnv() map[string]string {
	return map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": "/root",
		"TERM": "xterm-256color",
		"LANG": "C.UTF-8",
	}
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func (s *Server) maxFileSize() int64 {
	if s.MaxFileSize <= 0 || s.MaxFileSize > guestwire.MaxFileSize {
		return guestwire.MaxFileSize
	}
	return s.MaxFileSize
}

// Serve sends Hello on conn and answers requests until the connection ends,
// ctx ends, or the host asks for shutdown (ErrShutdown, after the answer has
// been written). Requests run concurrently; execs still running when Serve
// returns are killed. Serve closes conn.
func (s *Server) Serve(ctx context.Context, conn net.Conn) error {
	if s.Dial == nil || s.Reaper == nil {
		return errors.New("agent: Server needs Dial and Reaper")
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		conn.Close()
		wg.Wait()
	}()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	w := guestwire.NewWriter(conn)
	hello := s.Hello
	hello.ProtocolVersion = guestwire.ProtocolVersion
	if err := w.Write(&guestwire.Message{Type: guestwire.TypeHello, Hello: &hello}); err != nil {
		return fmt.Errorf("agent: sending hello: %w", err)
	}
	maxInFlight := s.MaxInFlight
	if maxInFlight <= 0 {
		maxInFlight = 256
	}
	sem := make(chan struct{}, maxInFlight)
	reply := func(m *guestwire.Message) {
		if err := w.Write(m); err != nil {
			s.log().Debug("writing an answer", "type", m.Type, "id", m.ID, "err", err)
		}
	}
	r := guestwire.NewReader(conn)
	for {
		var m guestwire.Message
		if err := r.Read(&m); err != nil {
			var de *guestwire.DecodeError
			switch {
			case errors.As(err, &de):
				s.log().Warn("undecodable request", "id", de.ID, "err", err)
				reply(errorMessage(de.ID, guestwire.Errorf(guestwire.CodeDecode, "the request did not decode: %v", de.Err)))
				continue
			case guestwire.IsRecoverable(err):
				reply(errorMessage(0, guestwire.Errorf(guestwire.CodeTooLarge, "%v", err)))
				continue
			case ctx.Err() != nil:
				return ctx.Err()
			}
			return fmt.Errorf("agent: reading the control connection: %w", err)
		}
		switch m.Type {
		case guestwire.TypePing:
			reply(&guestwire.Message{Type: guestwire.TypePong, ID: m.ID})
			continue
		case guestwire.TypeCancel:
			s.cancel(m.Target)
			reply(&guestwire.Message{Type: guestwire.TypeOK, ID: m.ID})
			continue
		case guestwire.TypeSync:
			// In the read loop: a fork pauses the VM once this is
			// answered, so nothing queued behind it may run first.
			unix.Sync()
			reply(&guestwire.Message{Type: guestwire.TypeOK, ID: m.ID})
			continue
		case guestwire.TypeShutdown:
			reply(&guestwire.Message{Type: guestwire.TypeOK, ID: m.ID})
			return ErrShutdown
		case guestwire.TypeSuspend:
			if s.BeforePark == nil {
				reply(errorMessage(m.ID, guestwire.Errorf(guestwire.CodeUnknown, "this agent cannot park (its channel is not a serial port)")))
				continue
			}
			if err := guestwire.ValidateSuspend(m.Suspend); err != nil {
				reply(errorMessage(m.ID, err))
				continue
			}
			// Before the answer: the host may save the VM as soon as it
			// has it.
			s.BeforePark(m.Suspend.WakeMarker)
			reply(&guestwire.Message{Type: guestwire.TypeOK, ID: m.ID})
			return ErrPark
		}
		select {
		case sem <- struct{}{}:
		default:
			reply(errorMessage(m.ID, guestwire.Errorf(guestwire.CodeBusy, "%d requests are already in flight", maxInFlight)))
			continue
		}
		var (
			execID uint64
			run    *runningExec
		)
		if m.Type == guestwire.TypeExec {
			var err error
			if execID, run, err = s.registerExec(m.ID, m.Exec); err != nil {
				<-sem
				reply(errorMessage(m.ID, err))
				continue
			}
		}
		wg.Add(1)
		go func(m guestwire.Message) {
			defer wg.Done()
			defer func() { <-sem }()
			reply(s.handleRegistered(ctx, &m, execID, run))
		}(m)
	}
}

func errorMessage(id uint64, err error) *guestwire.Message {
	var we *guestwire.Error
	if !errors.As(err, &we) {
		we = guestwire.Errorf(guestwire.CodeIO, "%v", err)
	}
	return &guestwire.Message{Type: guestwire.TypeError, ID: id, Error: we}
}

// handle answers one request. An exec may come registered (id, run) by
// Serve's read loop; otherwise it is registered here.
func (s *Server) handle(ctx context.Context, m *guestwire.Message) *guestwire.Message {
	return s.handleRegistered(ctx, m, 0, nil)
}

func (s *Server) handleRegistered(ctx context.Context, m *guestwire.Message, id uint64, run *runningExec) *guestwire.Message {
	var (
		resp *guestwire.Message
		err  error
	)
	switch m.Type {
	case guestwire.TypeBootConfig:
		err = s.bootConfig(m.BootConfig)
		resp = &guestwire.Message{Type: guestwire.TypeOK}
	case guestwire.TypeExec:
		if run == nil {
			id, run, err = s.registerExec(m.ID, m.Exec)
			if err != nil {
				break
			}
		}
		var res *guestwire.ExecResult
		res, err = s.exec(ctx, id, run, m.Exec)
		resp = &guestwire.Message{Type: guestwire.TypeExecResult, ExecResult: res}
	case guestwire.TypeFileRead, guestwire.TypeFileWrite, guestwire.TypeFileStat, guestwire.TypeMkdir:
		var res *guestwire.FileResult
		res, err = s.file(ctx, m.ID, m.Type, m.File)
		resp = &guestwire.Message{Type: guestwire.TypeFileResult, FileResult: res}
	case guestwire.TypeSocketOwner:
		if m.Socket == nil {
			err = guestwire.Errorf(guestwire.CodeInvalid, "socket_owner request has no socket")
			break
		}
		var owner *guestwire.SocketOwner
		owner, err = socketOwner(m.Socket, "/proc")
		resp = &guestwire.Message{Type: guestwire.TypeSocketOwnerResult, Owner: owner}
	default:
		err = guestwire.Errorf(guestwire.CodeUnknown, "unknown request type %q", m.Type)
	}
	if err != nil {
		return errorMessage(m.ID, err)
	}
	resp.ID = m.ID
	return resp
}

func (s *Server) file(ctx context.Context, id uint64, typ string, req *guestwire.FileRequest) (*guestwire.FileResult, error) {
	if req == nil {
		return nil, guestwire.Errorf(guestwire.CodeInvalid, "%s request has no file payload", typ)
	}
	switch typ {
	case guestwire.TypeFileRead, guestwire.TypeFileWrite:
		max := s.maxFileSize()
		if req.MaxSize < 0 || req.MaxSize > max {
			return nil, guestwire.Errorf(guestwire.CodeTooLarge, "%s %s: max size %d is outside 0..%d", typ, req.Path, req.MaxSize, max)
		}
		if req.MaxSize > 0 {
			max = req.MaxSize
		}
		ctx, stop := context.WithCancel(ctx)
		defer stop()
		if !s.startTransfer(id, stop) {
			return nil, guestwire.Errorf(guestwire.CodeBusy, "%s %s: %d file transfers are already in progress", typ, req.Path, guestwire.MaxFileTransfers)
		}
		defer s.endTransfer(id)
		if typ == guestwire.TypeFileRead {
			return s.sendFile(ctx, id, req, max)
		}
		return s.receiveFile(ctx, id, req, max)
	case guestwire.TypeFileStat:
		info, err := statFile(req.Path)
		if err != nil {
			return nil, err
		}
		return &guestwire.FileResult{Info: info}, nil
	default: // TypeMkdir
		info, err := mkdir(req.Path, req.Mode, req.Parents)
		if err != nil {
			return nil, err
		}
		return &guestwire.FileResult{Info: info}, nil
	}
}

// startTransfer takes one of the guestwire.MaxFileTransfers slots, or
// reports that none is free: each transfer holds a copy buffer and a
// stream, and PID 1's memory must not grow with what the host asks.
// A cancel for request id calls stop.
func (s *Server) startTransfer(id uint64, stop context.CancelFunc) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.transfers >= guestwire.MaxFileTransfers {
		return false
	}
	s.transfers++
	if s.transferStops == nil {
		s.transferStops = map[uint64]context.CancelFunc{}
	}
	s.transferStops[id] = stop
	return true
}

func (s *Server) endTransfer(id uint64) {
	s.mu.Lock()
	s.transfers--
	delete(s.transferStops, id)
	s.mu.Unlock()
}

// sendFile streams a file to the host on a data stream for request id.
// The file is opened (and refused) before the stream, so a refusal is an
// answer with no stream at all.
func (s *Server) sendFile(ctx context.Context, id uint64, req *guestwire.FileRequest, max int64) (*guestwire.FileResult, error) {
	f, info, err := openRead(req.Path, req.FollowSymlink, max)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	conn, err := s.openDataStream(ctx, id, guestwire.StreamFile)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	n, err := copyRead(conn, f, req.Path, max)
	if err != nil {
		return nil, err
	}
	return &guestwire.FileResult{Info: info, Bytes: n}, nil
}

// receiveFile writes the file the host sends on a data stream for request
// id (chunked, so a stream the host gave up on is never taken for the
// whole file).
func (s *Server) receiveFile(ctx context.Context, id uint64, req *guestwire.FileRequest, max int64) (*guestwire.FileResult, error) {
	conn, err := s.openDataStream(ctx, id, guestwire.StreamFile)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	info, n, err := writeFileFrom(req.Path, guestwire.NewChunkReader(conn), req.Mode, req.Parents, max)
	if err != nil {
		return nil, err
	}
	return &guestwire.FileResult{Info: info, Bytes: n}, nil
}

// bootConfig applies the boot config: all of it is checked first, so a
// refused key or path applies nothing; then files, the environment, the
// clock and the host name.
func (s *Server) bootConfig(c *guestwire.BootConfig) error {
	if err := guestwire.ValidateBootConfig(c); err != nil {
		return err
	}
	for _, f := range c.Files {
		if _, err := writeFile(f.Path, f.Data, f.Mode, true, s.maxFileSize()); err != nil {
			we := fsError("write", f.Path, err)
			return guestwire.Errorf(we.Code, "boot config file: %s", we.Message)
		}
	}
	if len(c.TrustCA) > 0 || len(c.ExtraRoots) > 0 {
		if err := trustCA(c.TrustCA, c.ExtraRoots); err != nil {
			return guestwire.Errorf(guestwire.CodeIO, "boot config trust_ca and extra_roots: %v", err)
		}
	}
	s.mu.Lock()
	if s.bootEnv == nil {
		s.bootEnv = map[string]string{}
	}
	maps.Copy(s.bootEnv, c.Env)
	s.mu.Unlock()
	if c.ClockUnixNano != 0 {
		if s.SetClock == nil {
			s.log().Debug("boot config clock ignored (no clock setter)")
		} else if err := s.SetClock(time.Unix(0, c.ClockUnixNano)); err != nil {
			return guestwire.Errorf(guestwire.CodePermission, "setting the clock: %v", err)
		}
	}
	if c.Hostname != "" {
		if s.SetHostname == nil {
			s.log().Debug("boot config hostname ignored (no hostname setter)")
		} else if err := s.SetHostname(c.Hostname); err != nil {
			return guestwire.Errorf(guestwire.CodePermission, "setting the host name to %q: %v", c.Hostname, err)
		}
	}
	if c.VMID != "" && s.ClaimIdentity != nil {
		if err := s.ClaimIdentity(c.VMID); err != nil {
			return guestwire.Errorf(guestwire.CodeIO, "giving the VM its own identity: %v", err)
		}
	}
	if s.FactsPath != "" {
		s.recordFacts(c)
	}
	return nil
}

// recordFacts writes what c set to s.FactsPath (guestwire.BootFacts); a
// failure only loses the doctor's reference, so it is logged.
func (s *Server) recordFacts(c *guestwire.BootConfig) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	f := guestwire.BootFacts{Hostname: c.Hostname, HostClockUnixNano: c.ClockUnixNano, BootTimeNano: ts.Nano(),
		EnvKeys: slices.Sorted(maps.Keys(c.Env))}
	b, _ := json.Marshal(f)
	err := os.MkdirAll(filepath.Dir(s.FactsPath), 0o755)
	if err == nil {
		err = os.WriteFile(s.FactsPath, b, 0o644)
	}
	if err != nil {
		s.log().Warn("recording the boot facts", "path", s.FactsPath, "err", err)
	}
}

// execEnv is the environment for an exec: base, then boot config, then the
// exec's own (all already validated).
func (s *Server) execEnv(own map[string]string) []string {
	env := s.BaseEnv
	if env == nil {
		env = DefaultEnv()
	}
	merged := maps.Clone(env)
	s.mu.Lock()
	maps.Copy(merged, s.bootEnv)
	s.mu.Unlock()
	maps.Copy(merged, own)
	out := make([]string, 0, len(merged))
	for k, v := range merged {
		out = append(out, k+"="+v)
	}
	return out
}

func (s *Server) defaultCwd() string {
	if s.DefaultCwd != "" {
		return s.DefaultCwd
	}
	if st, err := os.Stat("/root"); err == nil && st.IsDir() {
		return "/root"
	}
	return "/"
}
