package service

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/capsem/capsem/core/api"
)

// Error is a refusal with the HTTP status that says what kind it is: 400
// bad input, 404 unknown VM, 409 name taken or wrong state, 413 too large,
// 503 VM not running. Other errors are 500. Code (api.Error.Code) is the
// status's default unless set.
type Error struct {
	Status int
	Code   string
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

// unavailable: something the request needs cannot be had now (a root
// image that cannot be made here).
func unavailable(format string, args ...any) error {
	return refuse(http.StatusServiceUnavailable, format, args...)
}

// CodeOf is the api.Error code for err.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Code != "" {
		return e.Code
	}
	return api.CodeOf(StatusOf(err))
}

// StatusOf is the HTTP status for err.
func StatusOf(err error) int {
	var e *Error
	var body *api.BodyError
	switch {
	case errors.As(err, &e):
		return e.Status
	case errors.As(err, &body):
		return body.Status
	}
	return http.StatusInternalServerError
}

// failedEvent is the final event of a stream that err ended: its message
// and code, which the stream's 200 could not carry.
func failedEvent(err error) api.ExecEvent {
	return api.ExecEvent{Error: err.Error(), Code: CodeOf(err)}
}
