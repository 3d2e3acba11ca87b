// Package reloadctl lets `capsem policy reload` reach every running MCP
// endpoint (each `capsem gateway` and each per-VM process). Each registers a
// 0600 Unix socket named after its pid in the endpoints directory
// (paths.EndpointsDir) and
// answers POST /reload there with the outcome, so the caller learns whether
// the new policy took effect or why the old one stays in force.
package reloadctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/httpserve"
	"github.com/capsem/capsem/core/unixsock"
)

// Result is one endpoint's answer to a reload.
type Result struct {
	PID    int    `json:"pid"`
	Kind   string `json:"kind"` // gateway | vm
	Name   string `json:"name"` // socket path or VM name
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"` // what is in force now
}

// ReloadFunc reloads configuration and policy; the string describes what is
// in force afterwards.
type ReloadFunc func(ctx context.Context) (string, error)

// Register serves reload requests for this process, on a socket in dir,
// until ctx is done or the returned function is called.
func Register(ctx context.Context, dir, kind, name string, reload ReloadFunc, log *slog.Logger) (func(), error) {
	if err := unixsock.SecureDir(dir); err != nil {
		return nil, fmt.Errorf("endpoint registry: %w", err)
	}
	path := filepath.Join(dir, strconv.Itoa(os.Getpid())+".sock")
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("registering for policy reload: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reload", func(w http.ResponseWriter, r *http.Request) {
		res := Result{PID: os.Getpid(), Kind: kind, Name: name}
		detail, err := reload(r.Context())
		res.Detail = detail
		if err != nil {
			res.Error = err.Error()
			log.Error("policy reload failed; the previous policy stays in force", "err", err)
		} else {
			res.OK = true
			log.Info("policy reloaded on request", "detail", detail)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
	srv := httpserve.New(mux, httpserve.Options{HeaderTimeout: 5 * time.Second, Log: log})
	go func() { _ = srv.Serve(ln) }()
	stopped := make(chan struct{})
	stop := func() {
		select {
		case <-stopped:
			return
		default:
			close(stopped)
		}
		_ = srv.Close()
		_ = os.Remove(path)
	}
	go func() {
		select {
		case <-ctx.Done():
			stop()
		case <-stopped:
		}
	}()
	return stop, nil
}

// ReloadAll asks every registered endpoint to reload and returns their
// answers in pid order. Sockets whose owner is gone are removed.
func ReloadAll(ctx context.Context, dir string) ([]Result, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading endpoint registry: %w", err)
	}
	var results []Result
	for _, e := range entries {
		pidText, ok := strings.CutSuffix(e.Name(), ".sock")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil {
			continue
		}
		path := filepath.Join(dir, e.Name())
		res, err := reloadOne(ctx, path)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist) {
				_ = os.Remove(path) // its process is gone
				continue
			}
			res = Result{PID: pid, Error: err.Error()}
		}
		results = append(results, res)
	}
	sort.Slice(results, func(i, j int) bool { return results[i].PID < results[j].PID })
	return results, nil
}

func reloadOne(ctx context.Context, socket string) (Result, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return unixsock.Dial(ctx, socket)
		},
	}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://endpoint/reload", nil)
	if err != nil {
		return Result{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Result{}, err
	}
	var res Result
	if err := json.Unmarshal(body, &res); err != nil {
		return Result{}, fmt.Errorf("endpoint %s answered %s: %w", socket, resp.Status, err)
	}
	return res, nil
}
