// Package service is `capsem service`: the daemon that owns the user's
// VMs (core/service), in the foreground, or started, stopped and asked
// about with its subcommands.
package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/service"
	"github.com/capsem/capsem/core/unixsock"
	"github.com/capsem/capsem/core/version"
)

// Cmd is `capsem service [serve|start|stop|status]`.
type Cmd struct {
	Serve  ServeCmd  `cmd:"" default:"1" help:"Serve in the foreground (for systemd or a terminal)."`
	Start  StartCmd  `cmd:"" help:"Start the service in the background, unless one is serving."`
	Stop   StopCmd   `cmd:"" help:"Stop the service (its VMs keep running, for the next one to adopt)."`
	Status StatusCmd `cmd:"" help:"Say whether the service is serving, and its version."`
}

// ServeCmd serves in the foreground.
type ServeCmd struct {
	NoAutodetect bool   `env:"CAPSEM_NO_AUTODETECT" help:"Keep the mcpServers of Claude Code and Gemini CLI settings out of the VMs' gateways."`
	GuestBin     string `name:"guest-binary" type:"path" hidden:"" help:"CGO-free capsem build for /init (default: capsem-guest next to this executable)."`
	TCGCacheMiB  int    `name:"tcg-cache-mib" env:"CAPSEM_TCG_CACHE_MIB" help:"Bound the TCG translation cache of each VM that runs without KVM, in MiB (0: QEMU's default, which grows with the code the guest runs). Saves host memory per VM; costs speed (make bench measures both)."`
}

// Run serves until SIGINT, SIGTERM or a stop request.
func (c *ServeCmd) Run(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := service.Serve(ctx, service.Options{GuestBinary: c.GuestBin, NoAutodetect: c.NoAutodetect, TCGCacheMiB: c.TCGCacheMiB, RootImage: rootImage})
	if errors.Is(err, service.ErrAlreadyServing) {
		sock, _ := paths.ServiceSocket()
		fmt.Fprintf(os.Stderr, "capsem: a service is already serving on %s\n", sock)
		return nil
	}
	return err
}

// StartCmd starts the service detached.
type StartCmd struct{}

// Run starts it and waits until it answers.
func (StartCmd) Run(ctx context.Context) error {
	sock, err := paths.ServiceSocket()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if unixsock.Live(sock) {
		// Whatever listens must prove to be this user's service.
		v, err := apiclient.NewServiceClient(sock, nil).Version(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("capsem service %s already serving on %s (pid %d)\n", v.Version, sock, v.PID)
		return nil
	}
	c, err := service.Ensuring("", nil)
	if err != nil {
		return err
	}
	v, err := c.Version(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("capsem service %s serving on %s (pid %d)\n", v.Version, sock, v.PID)
	return nil
}

// StopCmd stops the service.
type StopCmd struct{}

// Run asks it to stop and waits until it is gone.
func (StopCmd) Run(ctx context.Context) error {
	sock, err := paths.ServiceSocket()
	if err != nil {
		return err
	}
	if !unixsock.Live(sock) {
		fmt.Println("no capsem service is serving")
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := apiclient.NewServiceClient(sock, nil).StopService(ctx); err != nil {
		return err
	}
	for unixsock.Live(sock) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the service did not stop: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	fmt.Println("capsem service stopped; its VMs keep running")
	return nil
}

// StatusCmd reports on the service.
type StatusCmd struct{}

// Run prints whether it serves; the exit status is 1 when it does not.
func (StatusCmd) Run(ctx context.Context) error {
	sock, err := paths.ServiceSocket()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := apiclient.NewServiceClient(sock, nil)
	v, err := c.Version(ctx)
	if err != nil {
		return fmt.Errorf("no capsem service answers on %s: %w", sock, err)
	}
	vms, err := c.List(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("capsem service %s serving on %s (pid %d), %d VM(s)\n", v.Version, sock, v.PID, len(vms))
	if v.Version != version.Version {
		fmt.Printf("this capsem is %s: restart the service to use it (capsem service stop; capsem service start)\n", version.Version)
	}
	return nil
}
