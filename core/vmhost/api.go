package vmhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/logs"
)

// maxRequestBody bounds JSON request bodies (file contents travel raw, on
// their own routes).
const maxRequestBody = 1 << 20

func (v *VM) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.RouteInfo, v.handleInfo)
	mux.HandleFunc("POST "+api.RouteExec, v.handleExec)
	mux.HandleFunc("GET "+api.RouteFileContent, v.handleReadContent)
	mux.HandleFunc("PUT "+api.RouteFileContent, v.handleWriteContent)
	mux.HandleFunc("POST "+api.RouteFileStat, v.handleFile)
	mux.HandleFunc("POST "+api.RouteFileMkdir, v.handleFile)
	mux.HandleFunc("POST "+api.RouteStop, v.handleStop)
	mux.HandleFunc("GET "+api.RouteLogs, v.handleLogs)
	mux.HandleFunc("POST "+api.RouteTerminal, v.handleTerminal)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, api.Error{Error: err.Error()})
}

func decodeBody(w http.ResponseWriter, r *http.Request, into any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("invalid request body: %w", err))
		return false
	}
	return true
}

func (v *VM) handleInfo(w http.ResponseWriter, r *http.Request) {
	state := "running"
	select {
	case <-v.stopped:
		state = "stopped"
	default:
	}
	writeJSON(w, http.StatusOK, api.Info{Name: v.opts.Name, PID: os.Getpid(), QEMUPID: v.machine.PID(), SessionDir: v.opts.SessionDir,
		Accel: v.accel.Name, AccelReason: v.accel.Reason, Start: v.start.String(), BootTimings: v.timings, State: state})
}

func (v *VM) handleStop(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
	// Answer first: stopping closes the listener this request came in on.
	go v.Stop(context.Background())
}

func (v *VM) handleExec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if err := checkExec(&req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	stream := api.NewExecStream(w)
	stream.Final(v.Exec(r.Context(), &req, stream.Stdout(), stream.Stderr()))
}

func (v *VM) handleFile(w http.ResponseWriter, r *http.Request) {
	var req api.FileRequest
	if !decodeBody(w, r, &req) {
		return
	}
	ctx := r.Context()
	var out api.FileResponse
	var info *guestwire.FileInfo
	var err error
	switch r.URL.Path {
	case api.RouteFileStat:
		info, err = v.ctl.Stat(ctx, req.Path)
	case api.RouteFileMkdir:
		mode := fs.FileMode(req.Mode)
		if mode == 0 {
			mode = 0o755
		}
		err = v.ctl.Mkdir(ctx, req.Path, mode, true)
	}
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, err)
		return
	}
	if info != nil {
		out.Size, out.Mode, out.ModTime = info.Size, info.Mode, info.ModTimeUnixNs/1e9
		out.IsDir = info.Mode&0o170000 == 0o040000 // S_IFDIR
	}
	writeJSON(w, http.StatusOK, out)
}

// handleReadContent answers GET /files/content?path=P with the file's bytes.
func (v *VM) handleReadContent(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	if path == "" {
		writeError(w, http.StatusBadRequest, errors.New("query parameter path is required"))
		return
	}
	read := v.ctl.ReadFile
	switch f := r.URL.Query().Get("follow"); f {
	case "", "0":
	case "1":
		read = v.ctl.ReadFileFollow
	default:
		writeError(w, http.StatusBadRequest, fmt.Errorf("query parameter follow=%q: want 0 or 1", f))
		return
	}
	data, err := read(r.Context(), path)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Write(data)
}

// handleWriteContent stores PUT /files/content?path=P[&mode=OCTAL]'s body as
// the file. The body is read into one buffer of its declared length, so a
// 64 MiB write costs 64 MiB here, not the growth steps of an unsized read.
func (v *VM) handleWriteContent(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path := q.Get("path")
	if path == "" {
		writeError(w, http.StatusBadRequest, errors.New("query parameter path is required"))
		return
	}
	mode := fs.FileMode(0o644)
	if s := q.Get("mode"); s != "" {
		// Only permission bits: setuid, setgid and sticky would be dropped
		// on the way to the guest, so they are refused rather than ignored.
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o777 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("query parameter mode=%q: want octal permission bits from 0 to 777, such as 644", s))
			return
		}
		mode = fs.FileMode(m)
	}
	if r.ContentLength > api.MaxFileBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("write %s: %d bytes, the limit is %d", path, r.ContentLength, api.MaxFileBytes))
		return
	}
	var data []byte
	var err error
	if r.ContentLength >= 0 {
		data = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, data)
	} else { // chunked: bounded, then measured
		data, err = io.ReadAll(io.LimitReader(r.Body, api.MaxFileBytes+1))
		if err == nil && len(data) > api.MaxFileBytes {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("write %s: more than %d bytes", path, api.MaxFileBytes))
			return
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("write %s: reading the request body: %w", path, err))
		return
	}
	if err := v.ctl.WriteFile(r.Context(), path, data, mode); err != nil {
		writeError(w, http.StatusUnprocessableEntity, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleLogs returns the tail of the guest's serial console log:
// ?tail=N lines (default logs.DefaultTailLines), optionally only lines
// containing ?grep=TEXT.
func (v *VM) handleLogs(w http.ResponseWriter, r *http.Request) {
	tail := 0
	if s := r.URL.Query().Get("tail"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("tail=%q: want a number of lines from 1 to %d", s, logs.TailMaxLines))
			return
		}
		tail = n
	}
	text, err := logs.Tail(v.session.ConsoleLog(), tail, r.URL.Query().Get("grep"))
	if errors.Is(err, fs.ErrNotExist) {
		writeError(w, http.StatusNotFound, fmt.Errorf("console log: %w", err))
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, text)
}
