package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/vmm"
)

// fakeMonitor is the QEMU end of a QMP socket pair, scripted by serve.
func fakeMonitor(t *testing.T, serve func(c *net.UnixConn, r *bufio.Reader)) *net.UnixConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "qmp")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	ours, theirs := conn(fds[0]), conn(fds[1])
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(theirs, bufio.NewReader(theirs))
	}()
	t.Cleanup(func() { ours.Close(); theirs.Close(); <-done })
	return ours
}

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}` + "\r\n"

// expect reads one command and checks its name.
func expect(t *testing.T, r *bufio.Reader, command string) map[string]any {
	line, err := r.ReadString('\n')
	if err != nil {
		t.Errorf("reading %s: %v", command, err)
		return nil
	}
	var req map[string]any
	if err := json.Unmarshal([]byte(line), &req); err != nil || req["execute"] != command {
		t.Errorf("got %q, want %s", line, command)
	}
	return req
}

func TestQMPExecute(t *testing.T) {
	conn := fakeMonitor(t, func(c *net.UnixConn, r *bufio.Reader) {
		c.Write([]byte(greeting))
		expect(t, r, "qmp_capabilities")
		c.Write([]byte(`{"return": {}}` + "\r\n"))
		req := expect(t, r, "query-migrate")
		if _, ok := req["arguments"]; ok {
			t.Errorf("arguments sent for a command without any: %v", req)
		}
		// An event before the answer is skipped.
		c.Write([]byte(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}` + "\r\n"))
		c.Write([]byte(`{"return": {"status": "completed"}}` + "\r\n"))
		req = expect(t, r, "migrate")
		if args, _ := req["arguments"].(map[string]any); args["uri"] != "fd:x" {
			t.Errorf("migrate arguments %v", req["arguments"])
		}
		c.Write([]byte(`{"error": {"class": "GenericError", "desc": "no such fd"}}` + "\r\n"))
	})
	ctx := context.Background()
	q, err := newQMP(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	ret, err := q.Execute(ctx, "query-migrate", nil, nil)
	if err != nil || !strings.Contains(string(ret), "completed") {
		t.Fatalf("query-migrate: %s %v", ret, err)
	}
	_, err = q.Execute(ctx, "migrate", map[string]any{"uri": "fd:x"}, nil)
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "GenericError" || qe.Desc != "no such fd" || qe.Command != "migrate" ||
		!strings.Contains(err.Error(), "migrate: GenericError: no such fd") {
		t.Fatalf("an error answer: %v", err)
	}
}

func TestQMPPassesDescriptor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	conn := fakeMonitor(t, func(c *net.UnixConn, r *bufio.Reader) {
		c.Write([]byte(greeting))
		expect(t, r, "qmp_capabilities")
		c.Write([]byte(`{"return": {}}` + "\r\n"))
		buf, oob := make([]byte, 4096), make([]byte, 128)
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil || !strings.Contains(string(buf[:n]), `"getfd"`) {
			t.Errorf("getfd: %q %v", buf[:n], err)
			return
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		var fds []int
		if len(msgs) == 1 {
			fds, _ = unix.ParseUnixRights(&msgs[0])
		}
		if len(fds) != 1 {
			t.Errorf("getfd came with %d descriptors, want 1", len(fds))
			return
		}
		// QEMU would write the state through it.
		unix.Write(fds[0], []byte("saved"))
		unix.Close(fds[0])
		c.Write([]byte(`{"return": {}}` + "\r\n"))
	})
	ctx := context.Background()
	q, err := newQMP(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := q.Execute(ctx, "getfd", map[string]any{"fdname": "s"}, f); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "saved" {
		t.Fatalf("the monitor's end wrote %q through the passed file, want %q", b, "saved")
	}
}

func TestQMPRefusesAndTimesOut(t *testing.T) {
	t.Run("not QMP", func(t *testing.T) {
		conn := fakeMonitor(t, func(c *net.UnixConn, r *bufio.Reader) { c.Write([]byte("QEMU 7.2 monitor - type 'help'\r\n")) })
		if _, err := newQMP(context.Background(), conn); err == nil || !strings.Contains(err.Error(), "did not greet with QMP") {
			t.Fatalf("a human monitor: %v", err)
		}
	})
	t.Run("silent", func(t *testing.T) {
		conn := fakeMonitor(t, func(c *net.UnixConn, r *bufio.Reader) {
			c.Write([]byte(greeting))
			expect(t, r, "qmp_capabilities")
			c.Write([]byte(`{"return": {}}` + "\r\n"))
			r.ReadString('\n') // and never answer
		})
		q, err := newQMP(context.Background(), conn)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := q.Execute(ctx, "query-status", nil, nil); err == nil || !strings.Contains(err.Error(), "query-status") {
			t.Fatalf("a silent monitor: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the deadline took %v to end the wait", d)
		}
	})
	t.Run("no return", func(t *testing.T) {
		conn := fakeMonitor(t, func(c *net.UnixConn, r *bufio.Reader) {
			c.Write([]byte(greeting))
			expect(t, r, "qmp_capabilities")
			c.Write([]byte(`{"id": 1}` + "\r\n"))
		})
		if _, err := newQMP(context.Background(), conn); err == nil || !strings.Contains(err.Error(), "neither return nor error") {
			t.Fatalf("an answer without return: %v", err)
		}
	})
}

// FuzzQMPAnswer feeds arbitrary monitor output to the client: it must end
// every command with a value or an error, never hang or panic.
func FuzzQMPAnswer(f *testing.F) {
	for _, s := range []string{
		`{"return": {"status": "completed"}}`,
		`{"error": {"class": "GenericError", "desc": "x"}}`,
		`{"event": "STOP"}` + "\n" + `{"return": {}}`,
		`{"return": null}`, `{}`, `[1,2]`, `{"return": 1`, "\x00\xff", strings.Repeat("a", 5000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		conn := fakeMonitor(t, func(c *net.UnixConn, r *bufio.Reader) {
			c.Write([]byte(greeting))
			r.ReadString('\n')
			c.Write([]byte(`{"return": {}}` + "\r\n"))
			r.ReadString('\n')
			c.Write(answer)
			c.Write([]byte("\n"))
			c.CloseWrite()
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q, err := newQMP(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		ret, err := q.Execute(ctx, "query-migrate", nil, nil)
		if err == nil && !json.Valid(ret) {
			t.Fatalf("accepted an invalid return %q", ret)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("hung on %q", answer)
		}
	})
}

// scriptedSave is a monitor that answers SaveState's commands in order,
// records them, writes "state" through the passed descriptor, and reports
// the migration as ending in final; contErr, when set, fails the cont.
func scriptedSave(t *testing.T, final, contErr string) (*Machine, *[]string) {
	var got []string
	conn := fakeMonitor(t, func(c *net.UnixConn, r *bufio.Reader) {
		c.Write([]byte(greeting))
		polls := 0
		for {
			buf, oob := make([]byte, 4096), make([]byte, 128)
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil || n == 0 {
				return
			}
			var req struct {
				Execute string `json:"execute"`
			}
			json.Unmarshal(buf[:n], &req)
			got = append(got, req.Execute)
			answer := `{"return": {}}`
			switch req.Execute {
			case "getfd":
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				if len(msgs) == 1 {
					if fds, _ := unix.ParseUnixRights(&msgs[0]); len(fds) == 1 {
						unix.Write(fds[0], []byte("state"))
						unix.Close(fds[0])
					}
				}
			case "query-migrate":
				polls++
				status := "active"
				if polls > 2 {
					status = final
				}
				answer = `{"return": {"status": "` + status + `", "error-desc": "disk full"}}`
			case "cont":
				if contErr != "" {
					answer = `{"error": {"class": "GenericError", "desc": "` + contErr + `"}}`
				}
			}
			c.Write([]byte(answer + "\r\n"))
		}
	})
	// The guest's RAM: 1 MiB with a page of data.
	fd, err := unix.MemfdCreate("ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	ram := os.NewFile(uintptr(fd), "ram")
	t.Cleanup(func() { ram.Close() })
	ram.Truncate(1 << 20)
	ram.WriteAt([]byte("capsem-ram"), 8192)
	return &Machine{spec: vmm.Spec{Monitor: true, MemoryMiB: 1}, monitorConn: conn, memory: ram, done: make(chan struct{})}, &got
}

func TestSaveStateSequence(t *testing.T) {
	want := []string{"qmp_capabilities", "migrate-set-parameters", "migrate-set-capabilities", "getfd", "stop", "migrate", "query-migrate", "query-migrate", "query-migrate", "cont"}
	for _, tc := range []struct {
		name, final, contErr string
		wantErr              string
		notResumed           bool
	}{
		{"saved", "completed", "", "", false},
		{"migration failed", "failed", "", "disk full", false},
		{"not resumed", "completed", "guest crashed", "guest crashed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, got := scriptedSave(t, tc.final, tc.contErr)
			path := filepath.Join(t.TempDir(), "vm.state")
			err := m.SaveState(context.Background(), path)
			if strings.Join(*got, " ") != strings.Join(want, " ") {
				t.Errorf("commands %v, want %v (paused before the save, resumed after it)", *got, want)
			}
			b, rerr := os.ReadFile(path)
			ram, ramErr := os.ReadFile(vmm.MemoryPath(path))
			if tc.wantErr == "" {
				if err != nil || string(b) != "state" {
					t.Fatalf("SaveState: %v; file %q %v", err, b, rerr)
				}
				// The RAM beside it, whole and at its offsets.
				if len(ram) != 1<<20 || string(ram[8192:8202]) != "capsem-ram" {
					t.Fatalf("the state's RAM: %d bytes, %v", len(ram), ramErr)
				}
				return
			}
			if !os.IsNotExist(ramErr) {
				t.Fatalf("a failed save left its RAM file: %v", ramErr)
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || errors.Is(err, ErrNotResumed) != tc.notResumed {
				t.Fatalf("got %v, want an error with %q (not resumed: %v)", err, tc.wantErr, tc.notResumed)
			}
			if !os.IsNotExist(rerr) {
				t.Fatalf("a failed save left %s: %v", path, rerr)
			}
			if left, _ := filepath.Glob(path + "*.tmp"); len(left) != 0 {
				t.Fatalf("temporary files left: %v", left)
			}
		})
	}
}
