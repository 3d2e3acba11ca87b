package vmhost

import (
	"context"
	"encoding/binary"
	"github.com/capsem/capsem/core/vmimage"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/netca"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/workspacefs"
	"github.com/capsem/capsem/vmm"
)

func needMkfs(t *testing.T) {
	t.Helper()
	if _, err := findMkfs(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (make deps installs e2fsprogs)", err)
		}
		t.Skipf("%v", err)
	}
}

func TestEnsureDiskIsSparseExt4AndReused(t *testing.T) {
	needMkfs(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "disk.img")
	created, err := ensureDisk(ctx, path, api.DefaultDiskGB)
	if err != nil || !created {
		t.Fatalf("first ensureDisk: created=%v %v", created, err)
	}
	u, err := vmimage.Usage(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fresh %d GiB disk: %d bytes allocated", api.DefaultDiskGB, u.Allocated)
	if u.Size != api.DefaultDiskGB<<30 || u.Allocated > 32<<20 {
		t.Fatalf("size %d, allocated %d: want %d, sparse (under 32 MiB)", u.Size, u.Allocated, api.DefaultDiskGB<<30)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("disk mode %v, want 0600", st.Mode().Perm())
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("the temporary image was left behind: %v", err)
	}
	if dumpe2fs, err := exec.LookPath("dumpe2fs"); err == nil {
		out, err := exec.Command(dumpe2fs, "-h", path).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Filesystem volume name:   "+diskLabel) || !strings.Contains(string(out), "Filesystem state:         clean") {
			t.Fatalf("dumpe2fs: %v\n%s", err, out)
		}
	}
	// A second boot reuses it untouched, even when asked for another size.
	created, err = ensureDisk(ctx, path, 1)
	if err != nil || created {
		t.Fatalf("second ensureDisk: created=%v %v", created, err)
	}
	st2, _ := os.Stat(path)
	if !os.SameFile(st, st2) || st2.ModTime() != st.ModTime() || st2.Size() != st.Size() {
		t.Fatal("the existing disk was replaced or changed")
	}
}

func TestEnsureDiskRefusesANonFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	os.Mkdir(path, 0o700)
	if _, err := ensureDisk(context.Background(), path, 1); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a directory as disk: %v", err)
	}
}

func TestPrepareStorage(t *testing.T) {
	needMkfs(t)
	ctx, log := context.Background(), slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	disks, workspace, cmdline, created, err := prepareStorage(ctx, log, storageRequest{sessionDir: dir, diskGiB: 1})
	if err != nil || !created {
		t.Fatalf("created %v, err %v", created, err)
	}
	if len(disks) != 1 || disks[0].ID != guestwire.UpperDiskID || disks[0].Path != (paths.Session{Dir: dir}).Disk() || disks[0].ReadOnly {
		t.Fatalf("disks %+v", disks)
	}
	ws := (paths.Session{Dir: dir}).Workspace()
	if workspace != ws {
		t.Fatalf("workspace %q, want %q", workspace, ws)
	}
	if st, err := os.Stat(ws); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("workspace: %v %v", st.Mode(), err)
	}
	if cmdline != " capsem.upper=capsem-upper capsem.workspace=workspace" {
		t.Fatalf("cmdline %q", cmdline)
	}
	// The second time the disk is reused, not created.
	if _, _, _, created, err := prepareStorage(ctx, log, storageRequest{sessionDir: dir, diskGiB: 1}); err != nil || created {
		t.Fatalf("reuse: created %v, err %v", created, err)
	}
	// Without a disk the workspace is still there.
	disks, workspace, cmdline, _, err = prepareStorage(ctx, log, storageRequest{sessionDir: t.TempDir()})
	if err != nil || len(disks) != 0 || workspace == "" || cmdline != " capsem.workspace=workspace" {
		t.Fatalf("no disk: %+v %q %q %v", disks, workspace, cmdline, err)
	}
	for _, bad := range []int{-1, api.MaxDiskGB + 1} {
		if _, _, _, _, err := prepareStorage(ctx, log, storageRequest{sessionDir: t.TempDir(), diskGiB: bad}); err == nil {
			t.Errorf("disk size %d accepted", bad)
		}
	}
}

func TestPrepareStorageWithARootImage(t *testing.T) {
	needMkfs(t)
	ctx, log := context.Background(), slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	image := filepath.Join(dir, "root.erofs")
	superblock := make([]byte, 4096)
	binary.LittleEndian.PutUint32(superblock[1024:], erofsMagic)
	os.WriteFile(image, superblock, 0o644)
	disks, _, cmdline, _, err := prepareStorage(ctx, log, storageRequest{sessionDir: dir, diskGiB: 1, rootImage: image})
	if err != nil {
		t.Fatal(err)
	}
	if len(disks) != 2 || disks[0] != (vmm.Disk{ID: guestwire.BaseDiskID, Path: image, ReadOnly: true}) || disks[1].ID != guestwire.UpperDiskID {
		t.Fatalf("disks %+v", disks)
	}
	if cmdline != " capsem.lower=capsem-base capsem.upper=capsem-upper capsem.workspace=workspace" {
		t.Fatalf("cmdline %q", cmdline)
	}
	notErofs := filepath.Join(dir, "ext4.img")
	os.WriteFile(notErofs, make([]byte, 4096), 0o644)
	for _, tc := range []struct {
		name, image string
		disk        int
		err         string
	}{
		{"no disk for the upper layer", image, 0, "needs a per-VM disk"},
		{"missing", filepath.Join(dir, "gone.erofs"), 1, "no such file"},
		{"a directory", dir, 1, "not a regular file"},
		{"not erofs", notErofs, 1, "not an EROFS image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, _, _, err := prepareStorage(ctx, log, storageRequest{sessionDir: t.TempDir(), diskGiB: tc.disk, rootImage: tc.image}); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func TestCheckWorkspaceDir(t *testing.T) {
	capsemHome := filepath.Join(t.TempDir(), "capsem-home")
	os.MkdirAll(filepath.Join(capsemHome, "run"), 0o700)
	t.Setenv("CAPSEM_HOME", capsemHome)
	home := t.TempDir()
	t.Setenv("HOME", home)
	project := t.TempDir()
	file := filepath.Join(project, "file")
	os.WriteFile(file, nil, 0o600)
	link := filepath.Join(t.TempDir(), "link-to-home")
	os.Symlink(home, link)
	for _, tc := range []struct {
		name, dir, err string
	}{
		{"a project", project, ""},
		{"relative", "project", "want an absolute path"},
		{"missing", filepath.Join(project, "gone"), "no such file"},
		{"a file", file, "not a directory"},
		{"the root", "/", "the whole host"},
		{"the root, unclean", "/./", "the whole host"},
		{"home", home, "your home directory"},
		{"home through a link", link, "your home directory"},
		{"a kernel interface", "/proc/self", "kernel interface"},
		{"capsem's home", capsemHome, "capsem's home"},
		{"inside capsem's home", filepath.Join(capsemHome, "run"), "capsem's home"},
		{"holding capsem's home", filepath.Dir(capsemHome), "capsem's home"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckWorkspaceDir(tc.dir)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want one containing %q", err, tc.err)
			}
		})
	}
}

func TestGuestRoots(t *testing.T) {
	dir := t.TempDir()
	ca, err := netca.LoadOrCreate(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "local"), 0o755)
	os.WriteFile(filepath.Join(dir, "local", "proxy.crt"), ca.CertPEM(), 0o644)
	os.WriteFile(filepath.Join(dir, "local", "junk.crt"), []byte("not a certificate"), 0o644)
	os.WriteFile(filepath.Join(dir, "local", "bad.crt"), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "key-and-cert.pem"), append([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), ca.CertPEM()...), 0o644)
	if err := syscall.Mkfifo(filepath.Join(dir, "local", "fifo.crt"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name     string
		patterns []string
		certs    int
	}{
		{"a glob: the good file, the others (a FIFO too) skipped", []string{filepath.Join(dir, "local", "*.crt")}, 1},
		{"the same file twice counts once", []string{filepath.Join(dir, "local", "proxy.crt"), filepath.Join(dir, "local", "*.crt")}, 1},
		{"only the certificate of a file with a key", []string{filepath.Join(dir, "key-and-cert.pem")}, 1},
		{"nothing matches", []string{filepath.Join(dir, "none", "*.crt")}, 0},
		{"two files", []string{filepath.Join(dir, "local", "proxy.crt"), filepath.Join(dir, "key-and-cert.pem")}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := guestRoots(log, tc.patterns)
			if n := strings.Count(string(got), "-----BEGIN CERTIFICATE-----"); n != tc.certs || strings.Contains(string(got), "PRIVATE KEY") {
				t.Errorf("%d certificates in %q", n, got)
			}
		})
	}
}

// TestWorkspaceBoundDefault: the VM configuration's default workspace
// bound is the workspace server's own.
func TestWorkspaceBoundDefault(t *testing.T) {
	if api.DefaultWorkspaceMiB != workspacefs.DefaultBytes>>20 {
		t.Fatalf("api.DefaultWorkspaceMiB %d, workspacefs.DefaultBytes %d MiB", api.DefaultWorkspaceMiB, workspacefs.DefaultBytes>>20)
	}
}
