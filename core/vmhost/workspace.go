package vmhost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/workspacefs"
)

// workspace is the VM's workspace server: the session's workspace
// directory served over 9p on the machine's workspace port (a stream of its
// own, not the channel: no multiplexer on either side of each request),
// within its size bound (workspacefs).
type workspace struct {
	fs   *workspacefs.FS
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// openWorkspace scans dir (the usage a restarted VM starts from) and
// prepares its server; nothing is served before serve.
func openWorkspace(ctx context.Context, v *VM, dir string) (*workspace, error) {
	mib := v.opts.WorkspaceMiB
	if mib == 0 {
		mib = api.DefaultWorkspaceMiB
	}
	// What the guest can make the server log (refusals, bad messages) is
	// rate-limited. The server logs what it found ("workspacefs: opened",
	// with the usage and the bound).
	fs, err := workspacefs.Open(ctx, dir, workspacefs.Limits{Bytes: int64(mib) << 20}, logs.Limited(v.log, logs.LimitBurst, logs.LimitInterval))
	if err != nil {
		return nil, fmt.Errorf("the workspace %s: %w", dir, err)
	}
	return &workspace{fs: fs}, nil
}

// serve serves the guest's workspace connection, conn (the host end of
// the machine's workspace port), until it ends or close; a start retried on
// another machine serves that one's instead.
func (w *workspace) serve(ctx context.Context, v *VM, conn net.Conn) {
	w.end()
	ctx, w.stop = context.WithCancel(context.WithoutCancel(ctx))
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if err := w.fs.Serve(ctx, conn); err != nil && !errors.Is(err, context.Canceled) {
			v.log.Warn("the workspace connection ended", "err", err)
		}
	}()
}

// usage is the workspace's usage for the VM's info.
func (w *workspace) usage() *api.WorkspaceUsage {
	u := w.fs.Usage()
	return &api.WorkspaceUsage{UsedBytes: u.Bytes, LimitBytes: u.Limits.Bytes, Files: u.Inodes, FilesLimit: u.Limits.Inodes}
}

// end stops serving and waits until the connection ended.
func (w *workspace) end() {
	if w.stop != nil {
		w.stop()
		w.stop = nil
	}
	w.wg.Wait()
}

// close stops serving and closes the server.
func (w *workspace) close() {
	w.end()
	w.fs.Close()
}
