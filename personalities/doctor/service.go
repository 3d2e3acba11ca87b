package doctor

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/unixsock"
	"github.com/capsem/capsem/core/version"
)

// checkService reports whether a service serves, and whether it is this
// build.
func (h *host) checkService(ctx context.Context, r *doctor.Reporter) {
	sock, err := paths.ServiceSocket()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	if !unixsock.Live(sock) {
		r.Okf("no service serving on %s: the first capsem mcp call or VM command starts one", sock)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := apiclient.NewServiceClient(sock, nil).Version(ctx)
	if err != nil {
		r.Failf("capsem service stop; capsem service start", "the service on %s does not answer: %v", sock, err)
		return
	}
	if v.Version != version.Version {
		r.Warnf("restart it to run this build: capsem service stop; capsem service start (its VMs keep running)",
			"the service on %s (pid %d) runs capsem %s; this capsem is %s", sock, v.PID, v.Version, version.Version)
		return
	}
	r.Okf("serving on %s (pid %d, capsem %s)", sock, v.PID, v.Version)
}

// checkRunDir reports whether the run directory (sockets, sessions) is the
// owner's alone.
func (h *host) checkRunDir(ctx context.Context, r *doctor.Reporter) {
	dir, err := paths.RunDir()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	st, err := os.Stat(dir)
	if os.IsNotExist(err) {
		r.Okf("%s does not exist yet", dir)
		return
	}
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	if err := unixsock.CheckPrivateDir(dir); err != nil {
		r.Failf("set CAPSEM_RUN_DIR to a directory of your own (the service refuses this one)", "%v", err)
		return
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		r.Warnf("chmod 700 "+dir+" (the service does it when it starts)",
			"%s is mode %04o: other users may read the sessions in it", dir, perm)
		return
	}
	r.Okf("%s is the owner's alone (%04o)", dir, st.Mode().Perm()&fs.ModePerm)
}

// checkVMs reports the service's VMs by state; a defunct one warns.
func (h *host) checkVMs(ctx context.Context, r *doctor.Reporter) {
	sock, err := paths.ServiceSocket()
	if err != nil || !unixsock.Live(sock) {
		r.Okf("no service serving: no VMs to report")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	vms, err := apiclient.NewServiceClient(sock, nil).List(ctx)
	if err != nil {
		r.Failf("", "listing the VMs: %v", err)
		return
	}
	states := map[api.VMState]int{}
	var defunct []string
	for _, v := range vms {
		states[v.State]++
		if v.State == api.StateDefunct {
			defunct = append(defunct, v.ID)
		}
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(states)) {
		parts = append(parts, fmt.Sprintf("%d %s", states[s], s))
	}
	summary := "no VMs"
	if len(parts) > 0 {
		summary = strings.Join(parts, ", ")
	}
	if len(defunct) > 0 {
		r.Warnf("capsem logs "+defunct[0]+" says why; capsem rm (or capsem resume, for a named VM) clears it",
			"%s; the process of %s died", summary, strings.Join(defunct, ", "))
		return
	}
	r.Okf("%s", summary)
}
