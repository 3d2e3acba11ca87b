package aggregator

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Messages go out on the server's stdin and come back from its stdout (cat
// echoes them), and closing the connection ends a server that exits at EOF
// without any signal.
func TestCommandTransportRoundTripAndCleanClose(t *testing.T) {
	ctx := context.Background()
	cmd := exec.Command("cat")
	conn, err := (&commandTransport{cmd: cmd, terminate: 5 * time.Second}).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := jsonrpc.MakeID(float64(7))
	for i := 0; i < 3; i++ {
		if err := conn.Write(ctx, &jsonrpc.Request{ID: id, Method: "ping"}); err != nil {
			t.Fatal(err)
		}
		msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if req, ok := msg.(*jsonrpc.Request); !ok || req.Method != "ping" || req.ID != id {
			t.Fatalf("echo %d: %#v", i, msg)
		}
	}
	start := time.Now()
	if err := conn.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("a server that exits at EOF took %v to close (was it signalled?)", took)
	}
	if st := cmd.ProcessState; st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Fatalf("server not reaped or not a clean exit: %v", st)
	}
}

// A server that ignores EOF gets SIGTERM; one that ignores SIGTERM gets
// SIGKILL. Either way it is reaped before Close returns.
func TestCommandTransportTerminatesStuckServers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		signal syscall.Signal
	}{
		{"ignores EOF", `: > "$READY"; exec sleep 60`, syscall.SIGTERM},
		{"ignores SIGTERM", `trap '' TERM; : > "$READY"; while :; do sleep 0.05; done`, syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			cmd := exec.Command("sh", "-c", tc.script)
			cmd.Env = append(os.Environ(), "READY="+ready)
			conn, err := (&commandTransport{cmd: cmd, terminate: 100 * time.Millisecond}).Connect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			// The script marks when its trap is in place.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if _, err := os.Stat(ready); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the server script never started")
				}
			}
			err = conn.Close()
			st := cmd.ProcessState
			if st == nil {
				t.Fatalf("Close returned (%v) before the server was reaped", err)
			}
			ws := st.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != tc.signal {
				t.Fatalf("server ended with %v, want killed by %v", st, tc.signal)
			}
			if err == nil || !strings.Contains(err.Error(), "signal") {
				t.Fatalf("close error %v should report the signal", err)
			}
		})
	}
}

func TestCommandTransportStartFailure(t *testing.T) {
	_, err := (&commandTransport{cmd: exec.Command("/nonexistent/server"), terminate: time.Second}).Connect(context.Background())
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/server") {
		t.Fatalf("starting a missing command: %v", err)
	}
}
