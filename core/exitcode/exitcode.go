// Package exitcode carries a command's exit status up to main: a command
// whose outcome is a status rather than a failure (the guest command's own
// code, a doctor that found a problem) returns an Error, and main exits with
// its Code without printing it.
package exitcode

import (
	"errors"
	"fmt"
)

// Error is an exit status to exit with.
type Error struct{ Code int }

func (e Error) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Of returns the status err carries, if it carries one.
func Of(err error) (int, bool) {
	var e Error
	if errors.As(err, &e) {
		return e.Code, true
	}
	return 0, false
}
