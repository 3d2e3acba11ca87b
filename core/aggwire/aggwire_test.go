package aggwire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func sampleRequest() *Request {
	return &Request{ID: 7, Method: MethodInit, Version: ProtocolVersion, Servers: []ServerDef{
		{Name: "everything", Command: "npx", Args: []string{"-y", "@modelcontextprotocol/server-everything"}, Env: map[string]string{"A": "1"}, Enabled: true, ConnectTimeoutMS: 30000,
			ReadPaths: []string{"/opt/tools"}, WritePaths: []string{"/tmp/work"}},
		{Name: "remote", URL: "http://127.0.0.1:9/mcp", Headers: map[string]string{"X-Key": "v"}, Enabled: true},
	}}
}

func sampleResponse() *Response {
	return &Response{ID: 7, Tools: []Tool{{Name: "everything__echo", OriginalName: "echo", Server: "everything", Description: "Echo", InputSchema: []byte(`{"type":"object"}`), Annotations: &Annotations{ReadOnlyHint: true, OpenWorldHint: false}}},
		NetEvents: []NetEvent{{TimestampUnixNano: 1, Domain: "example.com", Port: 443, Method: "GET", Path: "/", StatusCode: 200, Decision: "allowed"}}}
}

func TestGolden(t *testing.T) {
	cases := map[string]interface {
		MarshalMsg([]byte) ([]byte, error)
	}{"request_init": sampleRequest(), "response_tools": sampleResponse()}
	for name, msg := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := msg.MarshalMsg(nil)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("..", "..", "testdata", "aggwire", name+".hex")
			if *update {
				os.WriteFile(path, []byte(hex.EncodeToString(got)+"\n"), 0o644)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("golden missing (run with -update): %v", err)
			}
			want, _ := hex.DecodeString(strings.TrimSpace(string(raw)))
			// Map iteration order makes env/header encoding order vary, so
			// compare decoded values, and bytes when there is no map.
			switch m := msg.(type) {
			case *Request:
				var back Request
				if _, err := back.UnmarshalMsg(want); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(&back, m) {
					t.Fatalf("golden decodes to %+v, want %+v", back, m)
				}
			case *Response:
				if !bytes.Equal(got, want) {
					t.Fatalf("encoding changed:\n got %x\nwant %x", got, want)
				}
			}
		})
	}
}

func TestFrameRoundTripAndLimits(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.Write(sampleRequest()); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(sampleResponse()); err != nil {
		t.Fatal(err)
	}
	// An oversized frame header followed by a valid frame: the reader skips
	// the oversized payload and stays in sync.
	big := make([]byte, 4+MaxFrame+1)
	big[0], big[1], big[2], big[3] = 0x01, 0x00, 0x00, 0x01
	var after bytes.Buffer
	NewWriter(&after).Write(&Request{ID: 9, Method: MethodShutdown})
	stream := append(append(buf.Bytes(), big...), after.Bytes()...)
	// A frame whose msgpack is garbage.
	stream = append(stream, 0, 0, 0, 2, 0xc1, 0xc1)
	NewWriter(&after).Write(&Request{ID: 10, Method: MethodShutdown})
	stream = append(stream, after.Bytes()[len(after.Bytes())/2:]...)

	r := NewReader(bytes.NewReader(stream))
	var req Request
	if err := r.Read(&req); err != nil || !reflect.DeepEqual(&req, sampleRequest()) {
		t.Fatalf("request: %v %+v", err, req)
	}
	var resp Response
	if err := r.Read(&resp); err != nil || resp.Tools[0].Name != "everything__echo" {
		t.Fatalf("response: %v", err)
	}
	if err := r.Read(&Request{}); !errors.Is(err, ErrFrameTooLarge) || !IsRecoverable(err) {
		t.Fatalf("oversized: %v", err)
	}
	var next Request
	if err := r.Read(&next); err != nil || next.ID != 9 {
		t.Fatalf("after oversized: %v %+v", err, next)
	}
	if err := r.Read(&Request{}); !IsRecoverable(err) {
		t.Fatalf("garbage msgpack must be recoverable: %v", err)
	}
	var last Request
	if err := r.Read(&last); err != nil || last.ID != 10 {
		t.Fatalf("after garbage: %v %+v", err, last)
	}
	if err := r.Read(&Request{}); err != io.EOF {
		t.Fatalf("want EOF, got %v", err)
	}
}

func TestWriterRejectsOversized(t *testing.T) {
	err := NewWriter(io.Discard).Write(&Response{ID: 1, Result: make([]byte, MaxFrame)})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v", err)
	}
}

// TestGeneratedCodeIsFresh regenerates the msgp code and compares it with
// the committed file, so a stale aggwire_gen.go fails the build.
func TestGeneratedCodeIsFresh(t *testing.T) {
	dir := t.TempDir()
	src, _ := os.ReadFile("aggwire.go")
	os.WriteFile(filepath.Join(dir, "aggwire.go"), src, 0o644)
	cmd := exec.Command("go", "tool", "msgp", "-file", filepath.Join(dir, "aggwire.go"), "-o", filepath.Join(dir, "aggwire_gen.go"), "-tests=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("msgp: %v\n%s", err, out)
	}
	fresh, _ := os.ReadFile(filepath.Join(dir, "aggwire_gen.go"))
	committed, _ := os.ReadFile("aggwire_gen.go")
	if !bytes.Equal(fresh, committed) {
		t.Fatal("aggwire_gen.go is stale: run `make generate` and commit the result")
	}
}

func FuzzUnmarshalRequest(f *testing.F) {
	b, _ := sampleRequest().MarshalMsg(nil)
	f.Add(b)
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Request
		if err := Unmarshal(data, &r); err != nil {
			return
		}
		out, err := r.MarshalMsg(nil)
		if err != nil {
			t.Fatalf("decoded request does not re-encode: %v", err)
		}
		var again Request
		if _, err := again.UnmarshalMsg(out); err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
	})
}

func FuzzUnmarshalResponse(f *testing.F) {
	b, _ := sampleResponse().MarshalMsg(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		if err := Unmarshal(data, &r); err != nil {
			return
		}
		if _, err := r.MarshalMsg(nil); err != nil {
			t.Fatalf("decoded response does not re-encode: %v", err)
		}
	})
}
