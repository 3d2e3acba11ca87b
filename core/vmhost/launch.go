package vmhost

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
)

// ProcessConfig is the configuration of one per-VM process: the flags of
// `capsem process` (which embeds it) and, through Args, the argv Launch
// starts it with, so the two cannot drift apart. Every field has a name
// tag.
type ProcessConfig struct {
	SessionDir string `name:"session-dir" required:"" type:"path" help:"Session directory (session.db, console log, sockets)."`
	Socket     string `name:"socket" required:"" type:"path" help:"Unix socket for this process's API (created 0600)."`
	Name       string `name:"name" default:"capsem" help:"VM name (hostname in the guest)."`
	// ID is the service's id of the VM, which its root records: a root
	// that records another VM's id is a clone's, and gets its own identity.
	ID string `name:"vm-id" help:"The VM's id (the service's); a root cloned from another VM gets its own identity at boot."`
	// VMConfig is the VM's configuration, as the service recorded it:
	// its flags are capsem create's.
	api.VMConfig `embed:""`
	GuestBin     string `name:"guest-binary" type:"path" help:"CGO-free capsem build for /init (default: capsem-guest next to this executable)."`
	RootImage    string `name:"root-image" type:"path" help:"Read-only root image (EROFS, from capsem image build) under the per-VM disk's layer; none: the minimal root (busybox)."`
	TCGCacheMiB  int    `name:"tcg-cache-mib" default:"0" help:"Bound QEMU's TCG translation cache, in MiB (0: QEMU's default, which grows with the code the guest runs); a small one saves host memory and costs speed. KVM ignores it."`
	// NetLoopbackOnly is a test's world: only loopback destinations.
	NetLoopbackOnly bool   `name:"net-loopback-only" hidden:"" help:"Let the VM's network dial loopback addresses only; every other dial is refused and logged."`
	Suspended       bool   `name:"suspended" hidden:"" help:"Resume the VM from the state its suspend saved in its session directory (or fail, saying why)."`
	NoBootState     bool   `name:"no-boot-state" help:"Boot the VM: neither resume the saved boot of its configuration nor save one (also CAPSEM_BOOT_STATE=off)."`
	BootStateDir    string `name:"boot-state-dir" type:"path" hidden:"" help:"Where saved boots live (default: the guest assets' own, under boot-states/)."`
	// ConsoleLogMaxKiB is a test's smaller console bound.
	ConsoleLogMaxKiB int `name:"console-log-max-kib" hidden:"" default:"0" help:"Rotate the console log past this many KiB (0: the default bound)."`
}

// Check reports what makes c unusable, naming the setting.
func (c ProcessConfig) Check() error {
	switch {
	case c.SessionDir == "":
		return errors.New("no session directory")
	case c.Socket == "":
		return errors.New("no API socket")
	case c.Base == api.BaseFull && c.RootImage == "":
		return errors.New("base full without a root image (--root-image)")
	case c.Base == api.BaseMinimal && c.RootImage != "":
		return fmt.Errorf("base minimal with a root image (%s)", c.RootImage)
	}
	return c.VM().Check()
}

// VM is c's VM configuration with its defaults, its base the one its root
// image makes: full with one, minimal without.
func (c ProcessConfig) VM() api.VMConfig {
	vc := c.VMConfig
	vc.Base = api.BaseMinimal
	if c.RootImage != "" {
		vc.Base = api.BaseFull
	}
	return vc.WithDefaults()
}

// Args renders c as the flags of `capsem process` that parse back into c:
// strings when set, integers always, booleans when true, a size given as
// a pointer when set, each entry of a list or map as a flag of its own.
func (c ProcessConfig) Args() []string {
	return appendArgs(nil, reflect.ValueOf(c))
}

func appendArgs(args []string, v reflect.Value) []string {
	for i := range v.NumField() {
		f, field := v.Field(i), v.Type().Field(i)
		if field.Tag.Get("kong") == "-" {
			continue
		}
		if _, embed := field.Tag.Lookup("embed"); embed {
			args = appendArgs(args, f)
			continue
		}
		name := "--" + field.Tag.Get("name")
		switch f.Kind() {
		case reflect.String:
			if s := f.String(); s != "" {
				args = append(args, name, s)
			}
		case reflect.Int:
			args = append(args, name, strconv.FormatInt(f.Int(), 10))
		case reflect.Bool:
			if f.Bool() {
				args = append(args, name)
			}
		case reflect.Pointer:
			if !f.IsNil() && f.Elem().Kind() == reflect.Int {
				args = append(args, name, strconv.FormatInt(f.Elem().Int(), 10))
			} else if !f.IsNil() {
				panic("vmhost: ProcessConfig pointer to " + f.Elem().Kind().String())
			}
		case reflect.Map:
			m, ok := f.Interface().(map[string]string)
			if !ok {
				panic("vmhost: ProcessConfig map of " + f.Type().String())
			}
			for _, k := range slices.Sorted(maps.Keys(m)) {
				args = append(args, name, k+"="+m[k])
			}
		case reflect.Slice:
			for j := range f.Len() {
				e, ok := f.Index(j).Interface().(fmt.Stringer)
				if !ok {
					panic("vmhost: ProcessConfig list of " + f.Type().Elem().String())
				}
				args = append(args, name, e.String())
			}
		default:
			panic("vmhost: ProcessConfig field of kind " + f.Kind().String())
		}
	}
	return args
}

// LaunchOptions say how Launch starts the process.
type LaunchOptions struct {
	// Executable is capsem ("": this executable).
	Executable string
	// Env is the process's environment (nil: this process's).
	Env []string
	// Detach gives the process a session of its own and no parent-death
	// signal, so that it outlives its starter (the service, across a
	// restart or an upgrade). Otherwise it is killed when the starter's
	// thread dies (capsem doctor's check VM).
	Detach bool
}

// Process is a per-VM process Launch started.
type Process struct {
	Client *apiclient.ProcessClient
	cmd    *exec.Cmd
	ready  *os.File
	logf   string

	exited  chan struct{}
	waitErr error
	once    sync.Once
}

// Launch starts `capsem process` for cfg, its output appended to the
// session's process log. It returns once the process runs; WaitReady waits
// for its API.
func Launch(cfg ProcessConfig, o LaunchOptions) (*Process, error) {
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("VM configuration: %w", err)
	}
	cfg.VMConfig = cfg.VM() // the process's argv says every setting
	self := o.Executable
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("locating the capsem executable: %w", err)
		}
	}
	if err := os.MkdirAll(cfg.SessionDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the session directory: %w", err)
	}
	logPath := paths.Session{Dir: cfg.SessionDir}.ProcessLog()
	logFile, err := logs.OpenRotated(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	cmd := exec.Command(self, append([]string{"process"}, cfg.Args()...)...)
	cmd.Env = o.Env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if o.Detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	ready, err := startWithReadyPipe(cmd)
	if err != nil {
		return nil, fmt.Errorf("starting the VM process: %w", err)
	}
	p := &Process{Client: apiclient.NewProcessClient(cfg.Socket), cmd: cmd, ready: ready, logf: logPath, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// startWithReadyPipe starts cmd, a `capsem process` command line, with a
// readiness pipe: the write end goes to the child as an extra file named by
// an added --ready-fd flag, on which the child writes the stages of its
// start (asked for with --ready-stages) and api.ReadyLine once its API
// accepts connections. The read end is returned.
func startWithReadyPipe(cmd *exec.Cmd) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating the readiness pipe: %w", err)
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, w)
	// ExtraFiles[i] is the child's descriptor 3+i.
	cmd.Args = append(cmd.Args, "--ready-stages", "--ready-fd", strconv.Itoa(2+len(cmd.ExtraFiles)))
	err = cmd.Start()
	w.Close() // the child holds its own copy
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// PID is the process's pid.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.exited }

// Wait waits for the process to exit and returns its status.
func (p *Process) Wait() error {
	<-p.exited
	return p.waitErr
}

// WaitReady waits until the process's API accepts connections and returns
// its Info, telling stage (when not nil) each stage of the start as the
// process reports it (never after WaitReady returns). No polling: it returns as soon as the API listens,
// and fails as soon as the process dies first, with the last lines of its
// log. When ctx ends first the process is killed.
func (p *Process) WaitReady(ctx context.Context, stage func(string)) (*api.Info, error) {
	got := make(chan error, 1)
	go func() { got <- readReadiness(p.ready, stage) }()
	var err error
	select {
	case err = <-got:
	case <-ctx.Done():
		err = fmt.Errorf("the VM was not ready in time: %w", context.Cause(ctx))
		p.Kill()
		// Closing the pipe ends the reader; once it has returned, stage
		// is called no more.
		p.ready.Close()
		<-got
	}
	p.ready.Close()
	if err != nil {
		// A process that is exiting writes its reason to the log first.
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
			p.Kill()
		}
		return nil, fmt.Errorf("%w (log: %s)", err, p.LogTail(8))
	}
	return p.Client.Info(ctx)
}

// readReadiness reads the readiness pipe (api.ReadyLine after any stage
// lines) until the ready line.
func readReadiness(r io.Reader, stage func(string)) error {
	br := bufio.NewReaderSize(r, api.MaxStageLine)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case err == io.EOF || (err == nil && len(line) == 0):
			return errors.New("the VM process ended before its API was ready")
		case errors.Is(err, bufio.ErrBufferFull):
			return fmt.Errorf("the VM process wrote a line of over %d bytes on its readiness pipe", api.MaxStageLine)
		case err != nil:
			return fmt.Errorf("reading the readiness pipe: %w", err)
		case string(line) == api.ReadyLine:
			return nil
		}
		text, ok := strings.CutPrefix(strings.TrimSuffix(string(line), "\n"), api.StagePrefix)
		if !ok {
			return fmt.Errorf("the VM process wrote %q on its readiness pipe, want %q or a stage", line, api.ReadyLine)
		}
		if stage != nil {
			stage(text)
		}
	}
}

// Stop asks the VM to stop and waits (bounded by ctx) for the process to
// exit; a process that does not is terminated, then killed.
func (p *Process) Stop(ctx context.Context) error {
	err := p.Client.Stop(ctx)
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
	if err == nil {
		err = context.Cause(ctx)
	}
	return fmt.Errorf("the VM process did not stop in time: %w", err)
}

// Kill kills the process (its QEMU child follows through its parent-death
// signal) and waits for it.
func (p *Process) Kill() {
	p.once.Do(func() { p.cmd.Process.Kill() })
	<-p.exited
}

// LogTail returns the last n lines of the process log, for error messages.
func (p *Process) LogTail(n int) string { return LogTail(p.logf, n) }

// LogTail returns the last n lines of the log at path, or why it cannot.
func LogTail(path string, n int) string {
	text, err := logs.Tail(path, n, "")
	if err != nil {
		return err.Error()
	}
	return strings.TrimRight(text, "\n")
}
