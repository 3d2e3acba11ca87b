package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm/qemu"
)

// ramApartBench measures, on QEMU alone, what keeping a VM's RAM apart from
// its device state gives a save (QEMU's memory-backend-file with share=on
// and the x-ignore-shared migration capability: the RAM stays in its file,
// and only the devices' state is saved), beside a whole-state save, on
// the same busybox guest (a shell that counts on the console): the save's
// time and size, and restore → running, which must carry the count on.
func ramApartBench(a *guestfs.Assets, accel qemu.Accel) error {
	dir, err := os.MkdirTemp("", "capsem-ram-apart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("\nSaving a VM's state, QEMU alone (a busybox guest, 1024 MB, under %s): the whole state in QEMU's migration stream (as capsem saved before), beside the devices' state with the RAM kept in its file (memory-backend-file share=on + x-ignore-shared, as capsem saves now)\n", accel.Name)
	for _, apart := range []bool{false, true} {
		save, size, restore, err := ramApartRound(a, accel, dir, apart)
		if err != nil {
			return err
		}
		what := "whole state (RAM in the stream)                         "
		if apart {
			what = "device state only (RAM kept in its file)                "
		}
		fmt.Printf("  %s: save %s, %.1f MB; restore → running %s, the guest counting on\n", what, ms(save), float64(size)/1e6, ms(restore))
	}
	return nil
}

func ramApartRound(a *guestfs.Assets, accel qemu.Accel, dir string, apart bool) (save time.Duration, size int64, restore time.Duration, err error) {
	mem, state := filepath.Join(dir, "mem.img"), filepath.Join(dir, "dev.state")
	os.Remove(mem)
	os.Remove(state)
	start := func(tag string, extra ...string) (*exec.Cmd, string, error) {
		sock := filepath.Join(dir, tag+".qmp")
		console := filepath.Join(dir, tag+".console")
		args := append(qemu.AccelArgs(accel), "-smp", "2", "-m", "1024M", "-nodefaults", "-no-user-config", "-nographic",
			"-kernel", a.Kernel, "-initrd", a.Initramfs,
			"-append", `console=ttyS0 panic=-1 rdinit=/bin/sh -- -c "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"`,
			"-serial", "file:"+console, "-qmp", "unix:"+sock+",server=on,wait=off")
		if apart {
			args = append([]string{"-M", "q35,memory-backend=mem", "-object", "memory-backend-file,id=mem,size=1024M,mem-path=" + mem + ",share=on"}, args...)
		} else {
			args = append([]string{"-M", "q35"}, args...)
		}
		cmd := exec.Command("qemu-system-x86_64", append(args, extra...)...)
		if err := cmd.Start(); err != nil {
			return nil, "", err
		}
		return cmd, console, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": apart}}}

	q, console, err := start("save")
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { q.Process.Kill(); q.Wait() }()
	c, err := dialQMP(ctx, filepath.Join(dir, "save.qmp"))
	if err != nil {
		return 0, 0, 0, err
	}
	if err := waitFor(ctx, console, "tick 5"); err != nil {
		return 0, 0, 0, err
	}
	if _, err := c.do("migrate-set-capabilities", caps); err != nil {
		return 0, 0, 0, err
	}
	t := time.Now()
	if _, err := c.do("stop", nil); err != nil {
		return 0, 0, 0, err
	}
	if _, err := c.do("migrate", map[string]any{"uri": "exec:cat > " + state}); err != nil {
		return 0, 0, 0, err
	}
	if err := c.waitMigration(ctx); err != nil {
		return 0, 0, 0, err
	}
	save = time.Since(t)
	last := lastTick(console)
	c.do("quit", nil)
	q.Wait()
	st, err := os.Stat(state)
	if err != nil {
		return 0, 0, 0, err
	}

	r, console, err := start("restore", "-incoming", "defer")
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { r.Process.Kill(); r.Wait() }()
	c, err = dialQMP(ctx, filepath.Join(dir, "restore.qmp"))
	if err != nil {
		return 0, 0, 0, err
	}
	if _, err := c.do("migrate-set-capabilities", caps); err != nil {
		return 0, 0, 0, err
	}
	t = time.Now()
	if _, err := c.do("migrate-incoming", map[string]any{"uri": "exec:cat " + state}); err != nil {
		return 0, 0, 0, err
	}
	for {
		out, err := c.do("query-status", nil)
		if err != nil {
			return 0, 0, 0, err
		}
		var status struct{ Status string }
		json.Unmarshal(out, &status)
		if status.Status == "running" {
			break
		}
		// The source was paused when saved, and its state says so.
		if status.Status == "paused" {
			if _, err := c.do("cont", nil); err != nil {
				return 0, 0, 0, err
			}
		}
		if ctx.Err() != nil {
			return 0, 0, 0, ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
	restore = time.Since(t)
	// The count carries on from where it was saved.
	if err := waitFor(ctx, console, fmt.Sprintf("tick %d", last+2)); err != nil {
		return 0, 0, 0, fmt.Errorf("the restored guest did not count on from %d: %w", last, err)
	}
	c.do("quit", nil)
	return save, st.Size(), restore, nil
}

// lastTick is the last count the guest printed.
func lastTick(console string) int {
	b, _ := os.ReadFile(console)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		fmt.Sscanf(strings.TrimSpace(l), "tick %d", &n)
	}
	return n
}

// waitFor waits until console holds want.
func waitFor(ctx context.Context, console, want string) error {
	for {
		// The serial console ends lines with "\r\n".
		if b, _ := os.ReadFile(console); strings.Contains(string(b), want+"\r") || strings.Contains(string(b), want+"\n") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%q never showed on the console: %w", want, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// qmpConn is a minimal QMP client for the measurement.
type qmpConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialQMP(ctx context.Context, sock string) (*qmpConn, error) {
	var conn net.Conn
	var err error
	for {
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
	c := &qmpConn{conn: conn, r: bufio.NewReader(conn)}
	if _, err := c.r.ReadString('\n'); err != nil {
		return nil, err
	}
	_, err = c.do("qmp_capabilities", nil)
	return c, err
}

func (c *qmpConn) do(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	for {
		line, err := c.r.ReadString('\n')
		if err != nil {
			if cmd == "quit" {
				return nil, nil
			}
			return nil, err
		}
		var resp struct {
			Event  string                 `json:"event"`
			Return json.RawMessage        `json:"return"`
			Error  *struct{ Desc string } `json:"error"`
		}
		if json.Unmarshal([]byte(line), &resp) != nil || resp.Event != "" {
			continue
		}
		if resp.Error != nil {
			return nil, errors.New(cmd + ": " + resp.Error.Desc)
		}
		return resp.Return, nil
	}
}

func (c *qmpConn) waitMigration(ctx context.Context) error {
	for {
		out, err := c.do("query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct{ Status string }
		json.Unmarshal(out, &st)
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s", st.Status)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(5 * time.Millisecond)
	}
}
