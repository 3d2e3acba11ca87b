package api

import "fmt"

// ExitError carries a command's exit status up to main, which exits with it.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }
