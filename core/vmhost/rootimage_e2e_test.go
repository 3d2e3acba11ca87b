package vmhost_test

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/vmhost"
)

// smallRootImage makes an EROFS root image with nothing of its own but a
// marker, an environment file and links to the initramfs's busybox and
// capsem binary, as a distribution image links its capsem commands: enough
// to prove the guest runs from the image and not the initramfs.
func smallRootImage(t *testing.T) string {
	t.Helper()
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		t.Fatalf("mkfs.erofs (Debian package erofs-utils; make deps installs it): %v", err)
	}
	tree := t.TempDir()
	busybox := guestwire.GuestInitramfs + "/bin/busybox"
	for _, d := range []string{"bin", "usr/bin", "etc/capsem", "root", "tmp", "proc", "sys", "dev", "run", "mnt"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, applet := range []string{"sh", "cat", "ls", "grep", "echo", "readlink", "sha256sum", "head", "id", "sleep"} {
		if err := os.Symlink(busybox, filepath.Join(tree, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range []string{"capsem", "capsem-mcp-server", "capsem-doctor"} {
		if err := os.Symlink(guestwire.GuestCapsemBinary, filepath.Join(tree, "usr/bin", cmd)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/image-marker":       "from the root image\n",
		"etc/machine-id":         "",
		"etc/passwd":             "root:x:0:0:root:/root:/bin/sh\n",
		"etc/capsem/environment": "PATH=/usr/bin:/bin\nIMAGE_SAYS=hello from the image env\nSHELL=/bin/sh\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(tree, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	image := filepath.Join(t.TempDir(), "root.erofs")
	if out, err := exec.Command(mkfs, "-zlz4", image, tree).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	return image
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestVMRunsFromARootImage: a VM with a root image runs from it (its
// files, its environment, its links to capsem), the image is mounted
// read-only and never written (a change lands in the per-VM layer), and a
// second boot of the same disk keeps the change and the machine id.
func TestVMRunsFromARootImage(t *testing.T) {
	image := smallRootImage(t)
	before := fileSum(t, image)
	dir := t.TempDir()
	withImage := func(c *vmhost.ProcessConfig) { c.RootImage = image; c.NoNetwork = true }
	v := launchVM(t, "rootimage", dir, withImage)

	out, _ := v.guestSh(t, `cat /etc/image-marker; echo "$IMAGE_SAYS|$SHELL|$PATH"; readlink /usr/bin/capsem-mcp-server; grep " `+guestwire.GuestRootImage+` " /proc/mounts; cat /etc/machine-id`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 {
		t.Fatalf("guest said:\n%s", out)
	}
	if lines[0] != "from the root image" {
		t.Errorf("marker %q: the root is not the image", lines[0])
	}
	if lines[1] != "hello from the image env|/bin/sh|/usr/bin:/bin" {
		t.Errorf("environment %q: the image's environment file was not applied", lines[1])
	}
	if lines[2] != guestwire.GuestCapsemBinary {
		t.Errorf("capsem-mcp-server links to %q", lines[2])
	}
	if f := strings.Fields(lines[3]); len(f) < 4 || f[2] != "erofs" || !strings.HasPrefix(f[3], "ro,") {
		t.Errorf("root image mount %q: want erofs, read-only", lines[3])
	}
	machineID := lines[4]
	if len(machineID) != 32 {
		t.Errorf("machine id %q", machineID)
	}
	// The capsem binary the image links to runs (the guest doctor's
	// storage checks see the image mounted read-only).
	doc, _ := v.guestSh(t, "capsem-doctor -k fs")
	if !strings.Contains(doc, guestwire.GuestRootImage) || !strings.Contains(doc, "RESULT: PASS") {
		t.Errorf("capsem-doctor in the image:\n%s", doc)
	}
	// A write to an image file lands in the per-VM layer; writing to the
	// image's own mount fails.
	v.guestSh(t, "echo changed by the guest > /etc/image-marker")
	if _, _, code := v.guestRun(t, "echo x > "+guestwire.GuestRootImage+"/etc/image-marker"); code == 0 {
		t.Error("the guest wrote into the root image's mount")
	}
	v.shutdown(t)
	if fileSum(t, image) != before {
		t.Fatal("the root image changed on the host")
	}

	v = launchVM(t, "rootimage", dir, withImage)
	defer v.stop(t)
	out, _ = v.guestSh(t, "cat /etc/image-marker /etc/machine-id")
	if want := "changed by the guest\n" + machineID + "\n"; out != want {
		t.Errorf("after a second boot: %q, want %q", out, want)
	}
}
