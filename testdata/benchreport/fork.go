package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmimage"
	"github.com/capsem/capsem/vmm"
)

// forkRuns is how many forks each fork figure is the median of.
const forkRuns = 3

// forkWorkload is what the source VM does before it is forked, as the
// reference's figure was taken: install a package (through the network
// policy) and write a workspace.
const forkWorkload = `set -e
npm install -g --no-audit --no-fund is-number@7.0.0 >/dev/null
mkdir -p /root/workspace/project/src
for i in $(seq 1 50); do head -c 4096 /dev/urandom | base64 > /root/workspace/project/src/file$i.txt; done
echo '{"name":"project"}' > /root/workspace/project/package.json`

// forkOnlyBench runs forkBench against a service of its own.
func forkOnlyBench(capsem, home string) (err error) {
	runDir, err := os.MkdirTemp("", "csf-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (the VMs' logs are kept in %s)", err, runDir)
			return
		}
		os.RemoveAll(runDir)
	}()
	env := append(os.Environ(), "CAPSEM_HOME="+home, "CAPSEM_RUN_DIR="+runDir, "CAPSEM_NO_AUTODETECT=1", "CAPSEM_LOG_LEVEL=warn")
	cmd := exec.Command(capsem, "service", "start")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("capsem service start: %w: %s", err, out)
	}
	ctx := context.Background()
	svc := apiclient.NewServiceClient(filepath.Join(runDir, "service.sock"), nil)
	defer func() {
		svc.Purge(ctx, true)
		svc.StopService(ctx)
	}()
	return forkBench(ctx, svc, home)
}

// forkBench measures forks of a running and of a stopped VM after the
// same workload (time and image size, beside the reference's figures and
// the seed's bound), the machine's floor for the copy (the same disk
// copied on the host alone), and create from the image → exec-ready
// beside create from the base.
func forkBench(ctx context.Context, svc *apiclient.ServiceClient, home string) error {
	fmt.Printf("\nFork and images (full root, 1024 MB; workload: npm install -g is-number, 50 workspace files)\n")
	src, err := svc.Create(ctx, api.CreateRequest{Name: "fork-bench", VMConfig: api.VMConfig{RAMMB: 1024, CPUs: 2}})
	if err != nil {
		return err
	}
	if r, err := svc.Exec(ctx, src.ID, api.ExecRequest{Command: forkWorkload}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("workload: %v %+v", err, r)
	}
	fork := func(state string) ([]time.Duration, api.Image, error) {
		var took []time.Duration
		var last api.Image
		for i := range forkRuns {
			name := fmt.Sprintf("fork-bench-%s-%d", state, i)
			svc.DeleteImage(ctx, name)
			t := time.Now()
			img, err := svc.Fork(ctx, src.ID, api.ForkRequest{Name: name})
			if err != nil {
				return nil, last, err
			}
			took = append(took, time.Since(t))
			last = img
			if i < forkRuns-1 {
				if err := svc.DeleteImage(ctx, name); err != nil {
					return nil, last, err
				}
			}
		}
		return took, last, nil
	}
	running, img, err := fork("running")
	if err != nil {
		return err
	}
	// The machine's floor: the same disk copied on the host alone, and
	// the workspace with it, without a VM to sync or pause.
	floorDir, err := os.MkdirTemp("", "fork-floor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(floorDir)
	t := time.Now()
	if _, err := vmimage.CopyDisk(ctx, vmm.Disk{Path: paths.Session{Dir: src.SessionDir}.Disk()}, filepath.Join(floorDir, "disk.img")); err != nil {
		return err
	}
	if _, err := vmimage.CopyTree(ctx, paths.Session{Dir: src.SessionDir}.Workspace(), filepath.Join(floorDir, "ws")); err != nil {
		return err
	}
	floor := time.Since(t)
	mb := func(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
	fmt.Printf("  fork of the running VM: %s (paused %d ms), image %s (disk %s allocated, workspace %s), median of %d\n",
		ms(median(running)), img.PausedMS, mb(img.SizeBytes), mb(img.DiskAllocated), mb(img.WorkspaceBytes), forkRuns)
	fmt.Printf("  the machine's floor, the same copy on the host alone: %s\n", ms(floor))
	fmt.Printf("  reference (Linux KVM): 170 ms, 17.5 MB; the seed's bound: < 500 ms, < 12 MB; target ≤ 100 ms, ≤ 12 MB\n")

	// create from the image → exec-ready, beside create from the base.
	var fromImage, fromBase []time.Duration
	for range forkRuns {
		for _, image := range []string{img.Name, ""} {
			t := time.Now()
			v, err := svc.Create(ctx, api.CreateRequest{Image: image, VMConfig: api.VMConfig{RAMMB: 1024, CPUs: 2}})
			if err != nil {
				return err
			}
			if _, err := svc.Exec(ctx, v.ID, api.ExecRequest{Argv: []string{"true"}}); err != nil {
				return err
			}
			d := time.Since(t)
			if image == "" {
				fromBase = append(fromBase, d)
			} else {
				fromImage = append(fromImage, d)
			}
			if err := svc.Delete(ctx, v.ID); err != nil {
				return err
			}
		}
	}
	fmt.Printf("  create → exec-ready from the image: %s   from the base: %s, medians of %d\n", ms(median(fromImage)), ms(median(fromBase)), forkRuns)

	if _, err := svc.Stop(ctx, src.ID); err != nil {
		return err
	}
	stopped, simg, err := fork("stopped")
	if err != nil {
		return err
	}
	fmt.Printf("  fork of the stopped VM: %s, image %s, median of %d\n", ms(median(stopped)), mb(simg.SizeBytes), forkRuns)
	for _, name := range []string{img.Name, simg.Name} {
		if err := svc.DeleteImage(ctx, name); err != nil {
			return err
		}
	}
	if _, err := svc.Resume(ctx, src.ID, api.ResumeRequest{}); err != nil {
		return err
	}
	if err := suspendBench(ctx, svc, src); err != nil {
		return err
	}
	if err := memoryForkBench(ctx, svc, src, median(fromImage)); err != nil {
		return err
	}
	return svc.Delete(ctx, src.ID)
}

// suspendBench suspends and resumes a running 1 GiB VM (after the fork
// workload) forkRuns times: the time of each, and the state's size.
func suspendBench(ctx context.Context, svc *apiclient.ServiceClient, src api.VM) error {
	var suspends, resumes []time.Duration
	var state, devices int64
	for range forkRuns {
		t := time.Now()
		if _, err := svc.Suspend(ctx, src.ID); err != nil {
			return err
		}
		suspends = append(suspends, time.Since(t))
		state, _ = vmimage.DirAllocated(paths.Session{Dir: src.SessionDir}.Suspend())
		st, _ := filepath.Glob(filepath.Join(paths.Session{Dir: src.SessionDir}.Suspend(), "*.state"))
		if len(st) == 1 {
			if fi, err := os.Stat(st[0]); err == nil {
				devices = fi.Size()
			}
		}
		t = time.Now()
		if _, err := svc.Resume(ctx, src.ID, api.ResumeRequest{}); err != nil {
			return err
		}
		if _, err := svc.Exec(ctx, src.ID, api.ExecRequest{Argv: []string{"true"}}); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(t))
	}
	fmt.Printf("  suspend of the running VM (1024 MB): %s, state %.1f MB (devices %.1f MB, the rest the RAM's data); resume → exec-ready: %s, medians of %d\n",
		ms(median(suspends)), float64(state)/1e6, float64(devices)/1e6, ms(median(resumes)), forkRuns)
	return nil
}

// memoryChildren is how many VMs the memory fork's figure makes of one
// image, all running at once.
const memoryChildren = 10

// memoryForkBench forks the running VM with its memory: the fork's time
// and the state's size; create from the image → exec-ready beside create
// from the disk-only image (fromDisk); then memoryChildren VMs of the
// image at once, each answering, with the host memory each takes beside
// a VM made from the base.
func memoryForkBench(ctx context.Context, svc *apiclient.ServiceClient, src api.VM, fromDisk time.Duration) error {
	const name = "fork-bench-memory"
	svc.DeleteImage(ctx, name)
	t := time.Now()
	img, err := svc.Fork(ctx, src.ID, api.ForkRequest{Name: name, Memory: true})
	if err != nil {
		return err
	}
	took := time.Since(t)
	defer svc.DeleteImage(ctx, name)
	fmt.Printf("  fork with memory of the running VM: %s (the source suspended and resumed: %d ms), state %.1f MB, image %.1f MB\n",
		ms(took), img.PausedMS, float64(img.StateBytes)/1e6, float64(img.SizeBytes)/1e6)
	var creates []time.Duration
	var ids []string
	defer func() {
		for _, id := range ids {
			svc.Delete(ctx, id)
		}
	}()
	for range memoryChildren {
		t := time.Now()
		v, err := svc.Create(ctx, api.CreateRequest{Image: name})
		if err != nil {
			return err
		}
		if _, err := svc.Exec(ctx, v.ID, api.ExecRequest{Argv: []string{"true"}}); err != nil {
			return err
		}
		creates = append(creates, time.Since(t))
		ids = append(ids, v.ID)
	}
	fmt.Printf("  create → exec-ready from the memory image: %s (median of %d)   from the disk-only image: %s\n",
		ms(median(creates)), memoryChildren, ms(fromDisk))
	// All at once now: each answers, and what each takes on the host.
	var perChild []int64
	for _, id := range ids {
		r, err := svc.Exec(ctx, id, api.ExecRequest{Command: "test -e /var/tmp/fork-bench-ran || touch /var/tmp/fork-bench-ran; echo ok"})
		if err != nil || r.Stdout != "ok\n" {
			return fmt.Errorf("child %s: %v %+v", id, err, r)
		}
		info, err := svc.Info(ctx, id)
		if err != nil || info.Process == nil {
			return fmt.Errorf("child %s: %v", id, err)
		}
		m := vmMemory(info.PID, info.Process.QEMUPID, info.RAMMB)
		perChild = append(perChild, m.ours+m.qemuOwn+m.guest)
	}
	base, err := svc.Create(ctx, api.CreateRequest{VMConfig: api.VMConfig{RAMMB: src.RAMMB, CPUs: src.CPUs}})
	if err != nil {
		return err
	}
	ids = append(ids, base.ID)
	info, err := svc.Info(ctx, base.ID)
	if err != nil || info.Process == nil {
		return fmt.Errorf("base VM: %v", err)
	}
	bm := vmMemory(info.PID, info.Process.QEMUPID, info.RAMMB)
	fmt.Printf("  %d VMs of the memory image at once, all answering: host memory (PSS) per VM %.0f MB (median); a VM made from the base: %.0f MB\n",
		memoryChildren, float64(medianInt(perChild))/1024, float64(bm.ours+bm.qemuOwn+bm.guest)/1024)
	return nil
}
