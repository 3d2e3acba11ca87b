package service

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
)

// handleTerminal opens a terminal in a running VM through its process and
// hands the client's connection over to it: once the process has switched
// protocols, the service answers 101 and carries the bytes both ways.
func (s *Service) handleTerminal(w http.ResponseWriter, r *http.Request) {
	var req api.TermRequest
	if !decode(w, r, &req, maxRequestBody) {
		return
	}
	v, _, err := s.running(r.PathValue("vm"))
	if err != nil {
		writeError(w, err)
		return
	}
	s.mu.Lock()
	sock := v.rec.Socket
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	vmConn, err := apiclient.DialTerminal(ctx, sock, api.RouteTerminal, req)
	cancel()
	if err != nil {
		writeError(w, refuse(statusOfClient(err), "VM %s: terminal: %v", r.PathValue("vm"), err))
		return
	}
	defer vmConn.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeError(w, fmt.Errorf("this connection cannot be taken over"))
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", api.TermUpgrade)
	if rw.Flush() != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(vmConn, rw.Reader)
		vmConn.CloseWrite()
		close(done)
	}()
	io.Copy(conn, vmConn) // until the VM's side ends, after the exit frame
	conn.Close()
	<-done
}

// statusOfClient is the status a per-VM API refusal carried, else 503.
func statusOfClient(err error) int {
	if se, ok := err.(*apiclient.StatusError); ok {
		return se.Status
	}
	return http.StatusServiceUnavailable
}
