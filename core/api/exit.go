package api

import "fmt"

// ExitError carries a command's exit status up to main, which exits with it.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// CommandExitCode is the status main exits with (main matches this method
// by name, so the guest build need not import this package; not ExitCode,
// which exec.ExitError has too).
func (e ExitError) CommandExitCode() int { return e.Code }
