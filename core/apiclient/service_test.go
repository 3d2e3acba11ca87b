package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
