package service

import (
	"errors"
	"fmt"
	"net/http"
)

// Error is a refusal with the HTTP status that says what kind it is: 400
// bad input, 404 unknown VM, 409 name taken or wrong state, 413 too large,
// 503 VM not running. Other errors are 500.
type Error struct {
	Status int
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func refuse(status int, format string, args ...any) error {
	return &Error{Status: status, Err: fmt.Errorf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return refuse(http.StatusBadRequest, format, args...)
}
func conflict(format string, args ...any) error { return refuse(http.StatusConflict, format, args...) }

// StatusOf is the HTTP status for err.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return http.StatusInternalServerError
}
