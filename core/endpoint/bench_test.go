package endpoint

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"path/filepath"
	"testing"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/mcpframe"
)

// echoUpstream answers every tools/call with one fixed result, so the
// benchmark times the endpoint alone: framing, parsing, policy, the
// stateless decoration, the ledger row and its commit, and the answer.
type echoUpstream struct{}

func (echoUpstream) Do(ctx context.Context, req *aggwire.Request) (*aggwire.Response, error) {
	return &aggwire.Response{Result: []byte(`{"content":[{"type":"text","text":"ping"}]}`)}, nil
}

// BenchmarkServeConnToolsCall sends tools/call frames over a Unix socket
// with c calls in flight (the relay's side of the gateway), each a request
// as the MCP Go SDK sends it, and reads the answers; every call gets its
// committed ledger row before its answer.
func BenchmarkServeConnToolsCall(b *testing.B) {
	for _, c := range []int{1, 64} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchServeConn(b, c) })
	}
}

func benchServeConn(b *testing.B, inFlight int) {
	dir := b.TempDir()
	led, err := ledger.Open(context.Background(), filepath.Join(dir, "session.db"), ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer led.Close()
	ep := New(Config{Upstream: echoUpstream{}, Recorder: LedgerRecorder{Ledger: led}, Version: "bench"})
	ln, err := net.Listen("unix", filepath.Join(dir, "ep.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		served <- ep.ServeConn(context.Background(), conn)
	}()
	client, err := net.Dial("unix", filepath.Join(dir, "ep.sock"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := client.Write([]byte(mcpframe.MetaPrefix + "bench\n")); err != nil {
		b.Fatal(err)
	}
	frame := func(id int) []byte {
		payload := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"name":"echo__echo","arguments":{"text":"ping"}}}`, id)
		f, err := mcpframe.Encode(&mcpframe.Frame{StreamID: uint32(id), Name: "bench", Payload: []byte(payload)})
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	window := make(chan struct{}, inFlight)
	readErr := make(chan error, 1)
	go func() {
		rd := mcpframe.NewReader(bufio.NewReader(client))
		for i := 0; i < b.N; i++ {
			f, err := rd.Read()
			if err != nil {
				readErr <- err
				return
			}
			// A fast error would flatter the figure: every answer must be the result.
			if !bytes.Contains(f.Payload, []byte(`"result":{"content":[{"type":"text","text":"ping"}]`)) {
				readErr <- fmt.Errorf("answer %q is not the echo result", f.Payload)
				return
			}
			<-window
		}
		readErr <- nil
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		window <- struct{}{}
		if _, err := client.Write(frame(i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-readErr; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	client.Close()
	if err := <-served; err != nil {
		b.Fatal(err)
	}
	// Each call is written twice (pending before dispatch, then its
	// answer) and leaves one complete row.
	if st := led.Stats(); st.Rows != 2*uint64(b.N) {
		b.Fatalf("%d ledger row writes for %d calls, want two each", st.Rows, b.N)
	}
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "session.db")+"?mode=ro")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var rows, pending int
	if err := db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(pending), 0) FROM mcp_calls`).Scan(&rows, &pending); err != nil || rows != b.N || pending != 0 {
		b.Fatalf("%d rows (%d pending) for %d calls: %v", rows, pending, b.N, err)
	}
}
