package agent

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPlanStorage(t *testing.T) {
	cases := map[string]storagePlan{
		"console=ttyS0 capsem.channel=serial":                                        {},
		"capsem.channel=serial capsem.upper=capsem-upper capsem.workspace=workspace": {upperSerial: "capsem-upper", workspaceTag: "workspace"},
		"capsem.workspace=ws":                                {workspaceTag: "ws"},
		"capsem.upper=capsem-upper capsem.lower=capsem-base": {upperSerial: "capsem-upper", lowerSerial: "capsem-base"},
	}
	for line, want := range cases {
		if got := planStorage(line); got != want {
			t.Errorf("%q: got %+v, want %+v", line, got, want)
		}
	}
	if !planStorage("quiet").empty() || planStorage("capsem.upper=x").empty() {
		t.Error("empty()")
	}
}

// fakeSysBlock makes a /sys/block stand-in: name → serial ("" for a disk
// without a serial file).
func fakeSysBlock(t *testing.T, disks map[string]string) string {
	dir := t.TempDir()
	for name, serial := range disks {
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		if serial != "" {
			// virtio-blk pads nothing, but other drivers end with a newline.
			os.WriteFile(filepath.Join(dir, name, "serial"), []byte(serial+"\n"), 0o444)
		}
	}
	return dir
}

func TestFindDiskBySerial(t *testing.T) {
	sys := fakeSysBlock(t, map[string]string{"vda": "base", "vdb": "capsem-upper", "loop0": ""})
	if got := findDisk(sys, "capsem-upper"); got != "/dev/vdb" {
		t.Fatalf("got %q, want /dev/vdb", got)
	}
	if got := findDisk(sys, "capsem"); got != "" {
		t.Fatalf("a serial prefix matched: %q", got)
	}
	if got := findDisk(filepath.Join(sys, "missing"), "base"); got != "" {
		t.Fatalf("no sysfs: %q", got)
	}
}

func TestWaitForDiskTimesOutWithTheSerial(t *testing.T) {
	sys := fakeSysBlock(t, map[string]string{"vda": "other"})
	start := time.Now()
	_, err := waitForDisk(context.Background(), sys, "capsem-upper", 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `"capsem-upper"`) {
		t.Fatalf("want an error naming the serial, got %v", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 2*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := waitForDisk(ctx, sys, "capsem-upper", time.Minute); err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Fatalf("cancelled wait: %v", err)
	}
}

func TestOverlayOptions(t *testing.T) {
	want := "lowerdir=/run/capsem/initramfs,upperdir=/run/capsem/disk/upper,workdir=/run/capsem/disk/work"
	if got := overlayOptions(initramfsView, diskMount); got != want {
		t.Fatalf("got %s", got)
	}
	// The overlay is assembled outside what moves into it: /run moves
	// into the new root, so the new root cannot be under /run.
	if strings.HasPrefix(newRoot+"/", "/run/") || !strings.HasPrefix(diskMount, "/run/") || !strings.HasPrefix(initramfsView, "/run/") || !strings.HasPrefix(baseMount, "/run/") {
		t.Fatal("staging paths")
	}
}

func TestImageEnv(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, file string
		want       map[string]string
	}{
		{"no file", "", DefaultEnv()},
		{"the image's own", "PATH=/opt/bin:/usr/bin\nSHELL=/bin/bash\n", func() map[string]string {
			e := DefaultEnv()
			e["PATH"], e["SHELL"] = "/opt/bin:/usr/bin", "/bin/bash"
			return e
		}()},
		{"refused", "LD_PRELOAD=/x.so\n", DefaultEnv()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if tc.file != "" {
				os.WriteFile(p, []byte(tc.file), 0o644)
			}
			got := imageEnv(slog.New(slog.DiscardHandler), p)
			if !maps.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEnsureMachineID(t *testing.T) {
	p := filepath.Join(t.TempDir(), "machine-id")
	os.WriteFile(p, nil, 0o444)
	log := slog.New(slog.DiscardHandler)
	ensureMachineID(log, p)
	first, _ := os.ReadFile(p)
	if len(strings.TrimSpace(string(first))) != 32 {
		t.Fatalf("machine id %q", first)
	}
	ensureMachineID(log, p) // kept once there
	if again, _ := os.ReadFile(p); string(again) != string(first) {
		t.Errorf("machine id changed: %q then %q", first, again)
	}
}
