package api

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serveInfo serves GET /info on a Unix socket, as a booted process does.
func serveInfo(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "p.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /info", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(Info{Name: "vm", State: "running", BootTimings: map[string]int64{"total": 42}})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestWaitReadyPipe(t *testing.T) {
	sock := serveInfo(t)
	cases := []struct {
		name    string
		write   string // then the write end closes; "" closes at once
		timeout time.Duration
		want    string // error substring; "" for success
	}{
		{name: "ready line", write: ReadyLine, timeout: 10 * time.Second},
		{name: "process died first", write: "", timeout: 10 * time.Second, want: "ended before its API was ready"},
		{name: "half a line then death", write: "rea", timeout: 10 * time.Second, want: "ended before its API was ready"},
		{name: "something else", write: "oops!\n", timeout: 10 * time.Second, want: `wrote "oops!\n"`},
		{name: "never ready", write: "-", timeout: 50 * time.Millisecond, want: "context deadline exceeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			switch tc.write {
			case "-": // holds the pipe open, silent
			default:
				w.WriteString(tc.write)
				w.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			start := time.Now()
			info, err := NewProcessClient(sock).WaitReadyPipe(ctx, r)
			if tc.want == "" {
				if err != nil || info.State != "running" || info.BootTimings["total"] != 42 {
					t.Fatalf("info %+v, err %v", info, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
			if tc.write == "-" && (!errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second) {
				t.Fatalf("a silent process: %v after %v; want the deadline, promptly", err, time.Since(start))
			}
			if _, err := r.Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
				t.Errorf("the read end is still open after WaitReadyPipe: %v", err)
			}
		})
	}
}

// TestStartWithReadyPipe: the child finds the pipe at the descriptor the
// added --ready-fd names, after any extra files the caller passed.
func TestStartWithReadyPipe(t *testing.T) {
	sock := serveInfo(t)
	for _, extra := range []int{0, 2} {
		// sh gets the flag as $1 and the descriptor as $2.
		cmd := exec.Command("sh", "-c", `[ "$1" = --ready-fd ] && printf 'ready\n' >&"$2"`, "sh")
		for range extra {
			f, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd.ExtraFiles = append(cmd.ExtraFiles, f)
		}
		r, err := StartWithReadyPipe(cmd)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		info, err := NewProcessClient(sock).WaitReadyPipe(ctx, r)
		cancel()
		if werr := cmd.Wait(); err != nil || werr != nil || info.State != "running" {
			t.Fatalf("with %d extra files: info %+v, err %v, child %v (args %q)", extra, info, err, werr, cmd.Args)
		}
	}
	if _, err := StartWithReadyPipe(exec.Command("/nonexistent/capsem")); err == nil {
		t.Fatal("starting a missing binary succeeded")
	}
}
