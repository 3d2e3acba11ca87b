package vmhost

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/ledger"
)

// handleTerminal opens a terminal session in the guest and hands the
// connection over to it (101 Switching Protocols): from then on it carries
// the terminal stream, both ways. The session is recorded as an
// exec_events row (source "terminal") with its exit status.
func (v *VM) handleTerminal(w http.ResponseWriter, r *http.Request) {
	var req api.TermRequest
	if !decodeBody(w, r, &req) {
		return
	}
	open := guestwire.TermOpen{Version: guestwire.TermProtocolVersion, Argv: req.Argv, Env: req.Env, Cwd: v.execCwd(req.Cwd), Rows: req.Rows, Cols: req.Cols}
	payload, _ := json.Marshal(open)
	if _, err := guestwire.ParseTermOpen(payload); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeError(w, http.StatusInternalServerError, errors.New("this connection cannot be taken over"))
		return
	}
	command := "(terminal) " + strings.Join(open.Argv, " ")
	if len(open.Argv) == 0 {
		command = "(terminal) /bin/sh -l"
	}
	// Recorded before it starts, like every command (see Exec).
	row := &ledger.ExecEvent{Command: command, Source: "terminal", Pending: true}
	if err := v.ledger.Write(context.WithoutCancel(r.Context()), row); err != nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("the terminal was not opened: recording it in the ledger failed: %w", err))
		return
	}
	row.Pending = false
	defer func() {
		if lerr := v.ledger.Write(context.WithoutCancel(r.Context()), row); lerr != nil {
			v.log.Error("exec_events row not completed", "err", lerr)
		}
	}()
	dctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	guest, err := v.machine.Channel().Dial(dctx, guestchan.PortTerminal)
	cancel()
	if err != nil {
		row.StderrPreview = "the terminal did not open: " + err.Error()
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("reaching the guest's terminal port: %w", err))
		return
	}
	defer guest.Close()
	if err := guestwire.WriteTermFrame(guest, guestwire.TermOpenKind, payload); err != nil {
		row.StderrPreview = "the terminal did not open: " + err.Error()
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("opening the terminal: %w", err))
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		row.StderrPreview = "the terminal did not open: " + err.Error()
		return
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", api.TermUpgrade)
	if err := rw.Flush(); err != nil {
		return
	}
	code, err := spliceTerminal(rw.Reader, conn, guest)
	row.DurationMS = time.Since(start).Milliseconds()
	if err == nil {
		c := int64(code)
		row.ExitCode = &c
	} else {
		row.StderrPreview = "terminal ended without an exit status: " + err.Error()
	}
}

// spliceTerminal carries a terminal stream between a client (its reads
// from clientR, which may hold bytes already buffered, its writes to
// client) and the guest, until the guest's exit frame, whose status it
// returns, or until either side goes away.
func spliceTerminal(clientR io.Reader, client io.Writer, guest net.Conn) (int32, error) {
	go func() {
		io.Copy(guest, clientR)
		// The client went away: the guest hangs the session up.
		if cw, ok := guest.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			guest.Close()
		}
	}()
	var buf []byte
	br := bufio.NewReader(guest)
	for {
		kind, p, err := guestwire.ReadTermFrame(br, &buf)
		if err != nil {
			return 0, err
		}
		if err := guestwire.WriteTermFrame(client, kind, p); err != nil {
			return 0, err
		}
		if kind == guestwire.TermExitKind {
			return guestwire.ParseExit(p)
		}
	}
}
