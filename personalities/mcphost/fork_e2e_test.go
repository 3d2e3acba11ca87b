package mcphost_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/testkit"
)

// TestForkImages: a VM that installed a Debian package through the network
// policy and wrote files across its filesystem and its workspace is forked
// while it runs (a process sits in its workspace); a VM made from the image
// has all of it, an identity of its own, and is independent of its source
// afterwards, both ways. A stopped VM forks too. Forks to a taken name or
// of an unknown VM, a create from a missing image and the delete of an image
// in use are refused, naming why.
func TestForkImages(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	c := startMCP(t, env, runDir)
	images := []string{"fork-tmpl", "fork-stopped"}
	rmImages := func() {
		for _, name := range images {
			cmd := exec.Command(testkit.CapsemBinary(t), "image", "rm", name)
			cmd.Env = env
			cmd.Run() // gone already, or never made
		}
	}
	rmImages() // a run that died midway left them in the shared home
	t.Cleanup(func() {
		for _, vm := range []string{"fork-child", "fork-child2", "fork-src"} {
			c.call("capsem_delete", map[string]any{"id": vm}, nil)
		}
		rmImages()
	})
	exec := c.shell

	var src hostmcp.VMOut
	c.must("capsem_create", map[string]any{"name": "fork-src", "ramMb": 1024}, &src)
	exec("fork-src", "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q jq >/dev/null")
	// Files in the root's layer, in /opt, and in the workspace; a process
	// whose working directory is the workspace.
	exec("fork-src", `set -e
echo root-layer > /etc/fork-marker
mkdir -p /opt/data && head -c 1048576 /dev/urandom > /opt/data/blob
mkdir -p /root/workspace/project && echo 'print("hi")' > /root/workspace/project/main.py
cd /root/workspace && (sleep 100000 </dev/null >/dev/null 2>&1 &)`)
	sums := exec("fork-src", "sha256sum /opt/data/blob /root/workspace/project/main.py /etc/fork-marker")
	srcMachineID := exec("fork-src", "cat /etc/machine-id")

	var img hostmcp.ImageOut
	c.must("capsem_fork", map[string]any{"id": "fork-src", "name": "fork-tmpl", "description": "jq and a project"}, &img)
	if img.Name != "fork-tmpl" || img.SourceID != src.ID || img.SourceState != "running" || img.Description != "jq and a project" || img.SizeBytes <= 0 {
		t.Fatalf("fork: %+v", img)
	}
	t.Logf("fork of a running VM: %d ms (paused %d ms), %d bytes", img.ForkMs, img.PausedMs, img.SizeBytes)
	// The root image it needs is pinned against the store's pruning.
	home := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CAPSEM_HOME="); ok {
			home = v
		}
	}
	full, ferr := os.ReadFile(filepath.Join(home, "assets", "refs", "full"))
	pins, perr := os.ReadFile(filepath.Join(home, "assets", "pins", "service"))
	if ferr != nil || perr != nil || len(full) < 24 || !strings.Contains(string(pins), string(full[:24])+"\n") {
		t.Errorf("the full root %q is not pinned: pins %q (%v, %v)", full, pins, ferr, perr)
	}
	// The source runs on, its process with it.
	if got := exec("fork-src", "pgrep -f 'sleep 100000' >/dev/null && echo alive"); got != "alive\n" {
		t.Errorf("the source after its fork: %q", got)
	}

	t.Run("refusals", func(t *testing.T) {
		c.refused("capsem_fork", map[string]any{"id": "fork-src", "name": "fork-tmpl"}, `an image named "fork-tmpl" exists`)
		c.refused("capsem_fork", map[string]any{"id": "fork-src", "name": "fork-src"}, `a VM named "fork-src" exists`)
		c.refused("capsem_fork", map[string]any{"id": "no-such-vm", "name": "x-fork"}, `no VM named "no-such-vm"`)
		c.refused("capsem_fork", map[string]any{"id": "fork-src", "name": "../evil"}, "image name")
		c.refused("capsem_create", map[string]any{"image": "no-such-image"}, `no image named "no-such-image"`)
		c.refused("capsem_create", map[string]any{"name": "fork-tmpl"}, `an image named "fork-tmpl" exists`)
		c.refused("capsem_create", map[string]any{"image": "fork-tmpl", "base": "minimal"}, `image "fork-tmpl" is of base "full"`)
	})

	var child hostmcp.VMOut
	c.must("capsem_create", map[string]any{"name": "fork-child", "image": "fork-tmpl"}, &child)
	if child.Image != "fork-tmpl" || child.RAMMb != 1024 {
		t.Errorf("child: %+v", child)
	}
	if got := exec("fork-child", "sha256sum /opt/data/blob /root/workspace/project/main.py /etc/fork-marker"); got != sums {
		t.Errorf("the child's files:\n%s\nthe source's:\n%s", got, sums)
	}
	if got := exec("fork-child", `echo '{"a":"jq works"}' | jq -r .a`); got != "jq works\n" {
		t.Errorf("the installed package in the child: %q", got)
	}
	if got := exec("fork-child", "hostname; cat /etc/machine-id"); got == "fork-child\n"+srcMachineID || !strings.HasPrefix(got, "fork-child\n") {
		t.Errorf("the child's identity %q (the source's machine id: %q)", got, srcMachineID)
	}

	// Independent from now on, both ways, disk and workspace.
	exec("fork-child", "echo child > /etc/only-child; echo child > /root/workspace/only-child")
	exec("fork-src", "echo src > /etc/only-src; echo src > /root/workspace/only-src")
	if got := exec("fork-src", "ls /etc/only-child /root/workspace/only-child 2>/dev/null | wc -l"); strings.TrimSpace(got) != "0" {
		t.Errorf("the child's writes reached the source: %q", got)
	}
	if got := exec("fork-child", "ls /etc/only-src /root/workspace/only-src 2>/dev/null | wc -l"); strings.TrimSpace(got) != "0" {
		t.Errorf("the source's writes reached the child: %q", got)
	}

	var l hostmcp.ListOut
	c.must("capsem_list", map[string]any{}, &l)
	var listed *hostmcp.ImageOut
	for i := range l.Images {
		if l.Images[i].Name == "fork-tmpl" {
			listed = &l.Images[i]
		}
	}
	if listed == nil || len(listed.UsedBy) != 1 || listed.UsedBy[0] != "fork-child" {
		t.Errorf("capsem_list's images: %+v", l.Images)
	}
	for _, v := range l.VMs {
		if v.Name == "fork-tmpl" {
			t.Errorf("the image is listed as a VM: %+v", v)
		}
	}
	c.refused("capsem_delete", map[string]any{"id": "fork-tmpl"}, `image "fork-tmpl" is in use by 1 VM(s) made from it ([fork-child])`)

	// A stopped VM forks too, with what it wrote after the first fork.
	c.must("capsem_stop", map[string]any{"id": "fork-src"}, nil)
	var stopped hostmcp.ImageOut
	c.must("capsem_fork", map[string]any{"id": "fork-src", "name": "fork-stopped"}, &stopped)
	if stopped.SourceState != "stopped" || stopped.PausedMs != 0 {
		t.Errorf("fork of a stopped VM: %+v", stopped)
	}
	t.Logf("fork of a stopped VM: %d ms, %d bytes", stopped.ForkMs, stopped.SizeBytes)
	c.must("capsem_create", map[string]any{"name": "fork-child2", "image": "fork-stopped", "ramMb": 768}, nil)
	if got := exec("fork-child2", "cat /etc/only-src /root/workspace/only-src; jq --version >/dev/null && echo jq"); got != "src\nsrc\njq\n" {
		t.Errorf("the stopped VM's image: %q", got)
	}

	// Once its VMs are gone, an image can go.
	c.must("capsem_delete", map[string]any{"id": "fork-child"}, nil)
	var del hostmcp.DeleteOut
	c.must("capsem_delete", map[string]any{"id": "fork-tmpl"}, &del)
	if !del.Image {
		t.Errorf("delete of an image: %+v", del)
	}
	c.refused("capsem_create", map[string]any{"image": "fork-tmpl"}, `no image named "fork-tmpl"`)
}
