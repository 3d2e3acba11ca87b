package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/testkit"
)

// TestSlowClientsDoNotLockOutLs attacks the real service as the issue
// found: ~20,000 connections sending a byte now and then used up its
// descriptors and locked everyone out. The service runs with 1,024
// descriptors; 2,000 clients send their headers or their body a byte every
// 200 ms, dialing again whenever they are let go. Meanwhile `capsem ls`
// answers every time, and the service's open descriptors stay well under
// its limit.
func TestSlowClientsDoNotLockOutLs(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	capsem := testkit.CapsemBinary(t)
	var serviceOut bytes.Buffer
	svcCmd := exec.Command("prlimit", "--nofile=1024:1024", capsem, "service")
	svcCmd.Env = env
	svcCmd.Stdout, svcCmd.Stderr = &serviceOut, &serviceOut
	if err := svcCmd.Start(); err != nil {
		t.Fatalf("starting the service under prlimit: %v", err)
	}
	exited := make(chan struct{})
	go func() { svcCmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// ServiceEnv's cleanup (registered first, run after this) stops
		// it as well; this reaps it.
		stop := exec.Command(capsem, "service", "stop")
		stop.Env = env
		stop.Run()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			svcCmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("the service's output:\n%s", serviceOut.String())
		}
	})
	sock := filepath.Join(runDir, "service.sock")
	svc := apiclient.NewServiceClient(sock, nil)
	var pid int
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := svc.Version(ctx)
		cancel()
		if err == nil {
			pid = v.PID
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service did not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pid != svcCmd.Process.Pid {
		t.Fatalf("the service answering is %d, not the one started (%d)", pid, svcCmd.Process.Pid)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var dials atomic.Int64
	for i := range 2000 {
		// Headers a byte at a time, or headers at once and then the body
		// a byte at a time.
		fast, slow := "", "GET /v1/vms HTTP/1.1\r\nHost: capsem\r\nX-Pad: "+strings.Repeat("a", 4000)+"\r\n\r\n"
		if i%2 == 1 {
			fast = "POST /v1/vms HTTP/1.1\r\nHost: capsem\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
			slow = `{"name":"` + strings.Repeat("b", 100000)
		}
		wg.Go(func() {
			for {
				dials.Add(1)
				sendSlowly(sock, fast, slow, 200*time.Millisecond, stop)
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	time.Sleep(3 * time.Second) // the attack under way: every client dialed

	maxFDs := 0
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a guard, not a bound
		cmd := exec.CommandContext(ctx, capsem, "ls", "--json")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil || strings.TrimSpace(string(out)) != "[]" {
			t.Fatalf("capsem ls %d during the attack: %v\n%s", i, err, out)
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatalf("the service's descriptors: %v", err)
		}
		maxFDs = max(maxFDs, len(fds))
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("%d dials by the slow clients; the service held at most %d descriptors", dials.Load(), maxFDs)
	// The connection bound is half the 1,024: room is left for its files,
	// its per-VM clients and the next connection.
	if maxFDs > 600 {
		t.Errorf("the service held %d descriptors under the attack, want at most 600 (a bound of 512 connections)", maxFDs)
	}
}

// sendSlowly dials sock, sends fast, then slow a byte every gap until the
// service lets the connection go, slow runs out, or stop closes.
func sendSlowly(sock, fast, slow string, gap time.Duration, stop <-chan struct{}) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return
	}
	defer c.Close()
	if _, err := c.Write([]byte(fast)); err != nil {
		return
	}
	for i := 0; i < len(slow); i++ {
		if _, err := c.Write([]byte{slow[i]}); err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(gap):
		}
	}
}
