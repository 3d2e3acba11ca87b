//go:build !linux

package agent

import (
	"context"
	"errors"
)

// Run refuses: the agent is the init of a Linux guest.
func (c *Cmd) Run(ctx context.Context) error {
	return errors.New("agent: the guest agent runs only inside a Linux VM")
}
