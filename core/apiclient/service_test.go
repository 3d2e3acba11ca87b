package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/api"
)

// TestStreamsFallBackOnAnOlderService: against a service from before the
// create and run streams (it has only POST /v1/vms and POST /v1/run), the
// streaming calls still create and run, without stages.
func TestStreamsFallBackOnAnOlderService(t *testing.T) {
	dir, err := os.MkdirTemp("", "cst-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.RouteVM, func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("POST "+api.RouteVMs, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.VM{ID: "vm-000000000001", State: api.StateRunning})
	})
	mux.HandleFunc("POST "+api.RouteRun, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.ExecResult{Stdout: "out", Stderr: "err", ExitCode: 3})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()

	c := NewServiceClient(sock, nil)
	ctx := context.Background()
	stages := 0
	vm, err := c.CreateStream(ctx, api.CreateRequest{}, func(string) { stages++ })
	if err != nil || vm.ID != "vm-000000000001" || stages != 0 {
		t.Errorf("create on an older service: %+v, %v, %d stages", vm, err, stages)
	}
	var stdout, stderr bytes.Buffer
	ev, err := c.RunStream(ctx, api.RunRequest{Exec: api.ExecRequest{Command: "x"}}, api.RunEvents{}, &stdout, &stderr)
	if err != nil || ev == nil || !ev.Done || ev.ExitCode != 3 || stdout.String() != "out" || stderr.String() != "err" {
		t.Errorf("run on an older service: %+v, %v, stdout %q, stderr %q", ev, err, stdout.String(), stderr.String())
	}
	// A refusal of the current service is not taken for an older one.
	mux.HandleFunc("POST "+api.RouteVMsLive, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(api.Error{Error: "a VM named \"dev\" exists already"})
	})
	if _, err := c.CreateStream(ctx, api.CreateRequest{Name: "dev"}, nil); err == nil || err.Error() != `a VM named "dev" exists already` {
		t.Errorf("a 409 from the create stream: %v", err)
	}
}

// A failure a stream reports after its 200 (an exec's final event, a read's
// trailers) comes back as the StatusError its code makes it, with the
// code's hint, from the service and from a VM's process alike; one without
// a code (a sender from before codes) stays a plain error.
func TestStreamFailuresKeepTheirCode(t *testing.T) {
	dir, err := os.MkdirTemp("", "csf-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	code := api.CodeInterrupted
	execStream := func(w http.ResponseWriter, r *http.Request) {
		s := api.NewExecStream(w)
		s.Stdout().Write([]byte("partial"))
		s.Final(api.ExecEvent{Error: "guestctl: control connection closed", Code: code})
	}
	readStream := func(w http.ResponseWriter, r *http.Request) {
		f := api.NewFileStream(w)
		f.Write([]byte("partial"))
		f.Fail(http.StatusServiceUnavailable, code, errors.New("guestctl: control connection closed"))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+api.RouteVMExecLive, execStream)
	mux.HandleFunc("POST "+api.RouteExec, execStream)
	mux.HandleFunc("GET "+api.RouteVMFileContent, readStream)
	mux.HandleFunc("GET "+api.RouteFileContent, readStream)
	// A run whose VM went away meanwhile (404 not_found in its final
	// event) is not taken for an older service's: its command does not
	// run again.
	mux.HandleFunc("POST "+api.RouteRunLive, func(w http.ResponseWriter, r *http.Request) {
		api.NewExecStream(w).Final(api.ExecEvent{Error: `no VM named "vm-000000000001"`, Code: api.CodeNotFound})
	})
	ranAgain := false
	mux.HandleFunc("POST "+api.RouteRun, func(w http.ResponseWriter, r *http.Request) {
		ranAgain = true
		json.NewEncoder(w).Encode(api.ExecResult{})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()

	svc, proc := NewServiceClient(sock, nil), NewProcessClient(sock)
	ctx := context.Background()
	calls := map[string]func() error{
		"the service's exec stream": func() error {
			_, err := svc.ExecStream(ctx, "dev", api.ExecRequest{Command: "x"}, io.Discard, io.Discard)
			return err
		},
		"the process's exec stream": func() error {
			_, err := proc.Exec(ctx, &api.ExecRequest{Command: "x"}, io.Discard, io.Discard)
			return err
		},
		"the service's streamed read": func() error {
			_, _, err := svc.ReadFileTo(ctx, "dev", "/x", false, io.Discard)
			return err
		},
		"the process's streamed read": func() error {
			_, _, err := proc.ReadFileTo(ctx, "/x", false, 0, io.Discard)
			return err
		},
	}
	var se *StatusError
	if _, err := svc.RunStream(context.Background(), api.RunRequest{Exec: api.ExecRequest{Command: "x"}}, api.RunEvents{}, io.Discard, io.Discard); ranAgain ||
		!errors.As(err, &se) || se.Code != api.CodeNotFound {
		t.Errorf("a run stream that failed not_found: %v, run again: %v", err, ranAgain)
	}
	for name, call := range calls {
		code = api.CodeInterrupted
		err := call()
		if !errors.As(err, &se) || se.Status != http.StatusConflict || se.Code != api.CodeInterrupted ||
			!strings.Contains(err.Error(), "control connection closed") || !strings.HasSuffix(err.Error(), "("+codeHints[api.CodeInterrupted]+")") {
			t.Errorf("%s: %#v, want 409 interrupted with its hint", name, err)
		}
		if strings.Contains(name, "read") && !errors.Is(err, api.ErrFileCut) {
			t.Errorf("%s: %v is not api.ErrFileCut", name, err)
		}
		code = ""
		if err := call(); err == nil || errors.As(err, &se) || !strings.Contains(err.Error(), "control connection closed") {
			t.Errorf("%s without a code: %#v, want a plain error", name, err)
		}
	}
}
