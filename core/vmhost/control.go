package vmhost

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/capsem/capsem/core/guestctl"
)

// Heartbeat of the control connection: a guest that answers no ping for
// heartbeatTimeout (a fork bomb, a host too loaded to run it) is
// unresponsive until its agent connects again.
const (
	heartbeatInterval = 5 * time.Second
	heartbeatTimeout  = 3 * heartbeatInterval
)

func (v *VM) controlOptions() guestctl.Options {
	return guestctl.Options{Log: v.log, HeartbeatInterval: heartbeatInterval, HeartbeatTimeout: heartbeatTimeout}
}

// control holds the connection to the guest agent while the VM runs.
type control struct {
	mu     sync.Mutex
	client *guestctl.Client
	// down says why and since when the guest does not answer; "" while
	// it does. client is then the lost connection, whose calls fail at
	// once with its reason.
	down string

	done chan struct{} // closed when supervise returns
}

// control is the connection to the guest agent: the current one, or while
// the guest does not answer, the lost one (its calls fail at once, saying
// why).
func (v *VM) control() *guestctl.Client {
	v.ctl.mu.Lock()
	defer v.ctl.mu.Unlock()
	return v.ctl.client
}

// unresponsive says why the guest does not answer, "" while it does.
func (v *VM) unresponsive() string {
	v.ctl.mu.Lock()
	defer v.ctl.mu.Unlock()
	return v.ctl.down
}

// superviseControl keeps the VM reachable while it runs: when the control
// connection is lost (the guest missed its heartbeat, or closed it) the
// VM is unresponsive until the agent connects again, which it does as
// soon as it runs again (it dials the control port whenever it loses the
// connection); that connection's Hello is checked like the first, and
// the VM is usable again, with nothing restarted. If the channel itself
// closes, the guest can never answer again: lost is told why, and the VM
// is stopped.
func (v *VM) superviseControl(ctx context.Context, lost func(error)) {
	defer close(v.ctl.done)
	for {
		c := v.control()
		select {
		case <-c.Done():
		case <-ctx.Done():
			return
		}
		// Its goroutines are gone and its ports free once Close returns.
		c.Close()
		if ctx.Err() != nil {
			return
		}
		since := time.Now()
		reason := c.Err()
		v.ctl.mu.Lock()
		v.ctl.down = fmt.Sprintf("since %s: %v", since.UTC().Format(time.RFC3339), reason)
		v.ctl.mu.Unlock()
		v.log.Warn("the guest does not answer: waiting for its agent to connect again", "err", reason)
		for {
			nc, err := guestctl.Accept(ctx, v.machine.Channel(), v.controlOptions())
			if err != nil {
				if ctx.Err() == nil {
					lost(fmt.Errorf("the guest stopped answering (%v) and its channel closed: %w", reason, err))
				}
				return
			}
			if h := nc.Hello(); h.AgentVersion != v.hello.AgentVersion || h.KernelRelease != v.hello.KernelRelease {
				v.log.Error("refusing a control connection from another agent", "agent", h.AgentVersion, "kernel", h.KernelRelease,
					"want_agent", v.hello.AgentVersion, "want_kernel", v.hello.KernelRelease)
				nc.Close()
				continue
			}
			v.ctl.mu.Lock()
			v.ctl.client, v.ctl.down = nc, ""
			v.ctl.mu.Unlock()
			v.log.Info("the guest answers again", "unresponsive_ms", time.Since(since).Milliseconds())
			break
		}
	}
}
