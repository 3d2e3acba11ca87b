package guestwire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// samples are the golden messages, one per payload kind.
func samples() map[string]*Message {
	return map[string]*Message{
		"hello": {Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, AgentVersion: "0.1.0", KernelRelease: "6.1.0-57-amd64",
			Boot: BootTimings{KernelToInitMS: 812, MountsMS: 3, ModulesMS: 41, ChannelMS: 7}}},
		"boot_config": {Type: TypeBootConfig, ID: 1, BootConfig: &BootConfig{Env: map[string]string{"CAPSEM_VM_ID": "vm1", "PATH": "/usr/bin:/bin"},
			Files: []BootFile{{Path: "/etc/capsem/x", Mode: 0o600, Data: []byte{0, 1, 2, 0xff}}}, ClockUnixNano: 1796000000000000000, Hostname: "vm1"}},
		"exec": {Type: TypeExec, ID: 2, Exec: &Exec{Argv: []string{"sh", "-c", "echo hi"}, Env: map[string]string{"A": "1"}, Cwd: "/root",
			TimeoutMS: 5000, StdoutCap: 20 << 20, StreamID: 2}},
		"exec_result": {Type: TypeExecResult, ID: 2, ExecResult: &ExecResult{ExitCode: 137, Signal: 9, TimedOut: true, StdoutTruncated: true,
			StdoutBytes: 20 << 20, StderrBytes: 5, StdoutSent: 10 << 20, StderrSent: 5, DurationMS: 5001}},
		"file_write": {Type: TypeFileWrite, ID: 3, File: &FileRequest{Path: "/root/a.bin", Mode: 0o644, Parents: true, MaxSize: 1 << 30}},
		"file_result": {Type: TypeFileResult, ID: 4, FileResult: &FileResult{Bytes: 5,
			Info: &FileInfo{Mode: 0o100644, Size: 5, ModTimeUnixNs: 1796000000000000000}}},
		"cancel":     {Type: TypeCancel, ID: 5, Target: 2},
		"error":      {Type: TypeError, ID: 6, Error: &Error{Code: CodeSymlink, Message: "/root/link: path component \"link\" is a symbolic link"}},
		"ping":       {Type: TypePing, ID: 7},
		"save_point": {Type: TypeSavePoint},
		"wake": {Type: TypeWake, Wake: &Wake{ClockUnixNano: 1796000000000000000,
			Seed: []byte("0123456789abcdef0123456789abcdef")}},
		"suspend":           {Type: TypeSuspend, ID: 8, Suspend: &Suspend{WakeMarker: []byte("0123456789abcdef")}},
		"sync":              {Type: TypeSync, ID: 9},
		"boot_config_vm_id": {Type: TypeBootConfig, ID: 10, BootConfig: &BootConfig{Hostname: "child", VMID: "vm-0123456789ab"}},
		"hello_woken": {Type: TypeHello, Hello: &Hello{ProtocolVersion: ProtocolVersion, AgentVersion: "0.1.0",
			Boot: BootTimings{KernelToInitMS: 812, ModulesMS: 41, StorageMS: 90, ChannelMS: 7, AfterWakeMS: 120}}},
	}
}

func TestGolden(t *testing.T) {
	for name, msg := range samples() {
		t.Run(name, func(t *testing.T) {
			got, err := msg.MarshalMsg(nil)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("..", "..", "testdata", "guestwire", name+".hex")
			if *update {
				os.MkdirAll(filepath.Dir(path), 0o755)
				if err := os.WriteFile(path, []byte(hex.EncodeToString(got)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("golden missing (run with -update): %v", err)
			}
			want, err := hex.DecodeString(strings.TrimSpace(string(raw)))
			if err != nil {
				t.Fatal(err)
			}
			// Maps encode in iteration order, so messages with an env map
			// are compared decoded; the others byte for byte.
			var back Message
			if _, err := back.UnmarshalMsg(want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(&back, msg) {
				t.Fatalf("golden decodes to %+v, want %+v", back, msg)
			}
			hasMap := (msg.BootConfig != nil && len(msg.BootConfig.Env) > 1) || (msg.Exec != nil && len(msg.Exec.Env) > 1)
			if !hasMap && !bytes.Equal(got, want) {
				t.Fatalf("encoding changed:\n got %x\nwant %x", got, want)
			}
		})
	}
	t.Run("stream_header", func(t *testing.T) {
		var buf bytes.Buffer
		if err := WriteStreamHeader(&buf, StreamHeader{ID: 42, Which: StreamStderr}); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("..", "..", "testdata", "guestwire", "stream_header.hex")
		if *update {
			os.WriteFile(path, []byte(hex.EncodeToString(buf.Bytes())+"\n"), 0o644)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("golden missing (run with -update): %v", err)
		}
		if got := hex.EncodeToString(buf.Bytes()); got != strings.TrimSpace(string(raw)) {
			t.Fatalf("encoding changed:\n got %s\nwant %s", got, raw)
		}
	})
}

func TestFrameRoundTripAndResync(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, m := range []*Message{samples()["exec"], samples()["file_result"]} {
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	stream := buf.Bytes()
	// An oversized length prefix: the reader skips its payload and stays in sync.
	over := make([]byte, 4+MaxFrame+1)
	binary.BigEndian.PutUint32(over, MaxFrame+1)
	stream = append(stream, over...)
	var tail bytes.Buffer
	NewWriter(&tail).Write(&Message{Type: TypePing, ID: 9})
	stream = append(stream, tail.Bytes()...)
	// A frame that is a map with an id but a field of the wrong type: the
	// decode fails, the id is still recovered.
	bad := []byte{0x82, 0xa2, 'i', 'd', 0x0b, 0xa4, 'e', 'x', 'e', 'c', 0xa3, 'b', 'a', 'd'}
	stream = binary.BigEndian.AppendUint32(stream, uint32(len(bad)))
	stream = append(stream, bad...)
	// Garbage msgpack.
	stream = append(stream, 0, 0, 0, 2, 0xc1, 0xc1)
	tail.Reset()
	NewWriter(&tail).Write(&Message{Type: TypePing, ID: 10})
	stream = append(stream, tail.Bytes()...)

	r := NewReader(bytes.NewReader(stream))
	var m Message
	if err := r.Read(&m); err != nil || !reflect.DeepEqual(&m, samples()["exec"]) {
		t.Fatalf("exec: %v %+v", err, m)
	}
	if err := r.Read(&m); err != nil || !reflect.DeepEqual(&m, samples()["file_result"]) {
		t.Fatalf("file_result: %v %+v", err, m)
	}
	if err := r.Read(&m); !errors.Is(err, ErrFrameTooLarge) || !IsRecoverable(err) {
		t.Fatalf("oversized: %v", err)
	}
	if err := r.Read(&m); err != nil || m.ID != 9 {
		t.Fatalf("after oversized: %v %+v", err, m)
	}
	var de *DecodeError
	if err := r.Read(&m); !errors.As(err, &de) || de.ID != 11 || !IsRecoverable(err) {
		t.Fatalf("wrong field type: want a DecodeError with id 11, got %v", err)
	}
	if err := r.Read(&m); !errors.As(err, &de) || de.ID != 0 {
		t.Fatalf("garbage: want a DecodeError with id 0, got %v", err)
	}
	if err := r.Read(&m); err != nil || m.ID != 10 || m.Type != TypePing {
		t.Fatalf("after garbage: %v %+v", err, m)
	}
	if err := r.Read(&m); err != io.EOF {
		t.Fatalf("want EOF, got %v", err)
	}
	// A cut stream is not a clean EOF.
	r = NewReader(bytes.NewReader(stream[:6]))
	if err := r.Read(&m); err == nil || err == io.EOF || IsRecoverable(err) {
		t.Fatalf("cut frame: %v", err)
	}
}

func TestWriterRejectsOversized(t *testing.T) {
	big := []BootFile{{Path: "/a", Data: make([]byte, MaxFrame)}}
	err := NewWriter(io.Discard).Write(&Message{Type: TypeBootConfig, BootConfig: &BootConfig{Files: big}})
	if !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), "boot_config") {
		t.Fatalf("got %v", err)
	}
	// The largest boot config the validator lets through fits in a frame.
	files := make([]BootFile, 3)
	for i := range files {
		files[i] = BootFile{Path: "/etc/f" + strconv.Itoa(i), Data: make([]byte, MaxBootFileSize)}
	}
	if err := NewWriter(io.Discard).Write(&Message{Type: TypeBootConfig, BootConfig: &BootConfig{Files: files}}); err != nil {
		t.Fatalf("three MaxBootFileSize files must fit: %v", err)
	}
}

// TestChunkStream: what a ChunkWriter sends, a ChunkReader gives back;
// a stream that ends before the end marker, anywhere, is ErrTransferCut and
// never a clean EOF; an oversized chunk is refused by name.
func TestChunkStream(t *testing.T) {
	data := make([]byte, 3*MaxChunk+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var stream bytes.Buffer
	cw := NewChunkWriter(&stream)
	if n, err := cw.ReadFrom(bytes.NewReader(data[:100000])); err != nil || n != 100000 {
		t.Fatalf("ReadFrom: %d %v", n, err)
	}
	if n, err := cw.Write(data[100000:]); err != nil || n != len(data)-100000 {
		t.Fatalf("Write: %d %v", n, err)
	}
	if err := cw.End(); err != nil {
		t.Fatal(err)
	}
	whole := stream.Bytes()
	back, err := io.ReadAll(NewChunkReader(bytes.NewReader(whole)))
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("round trip: %d bytes, %v", len(back), err)
	}
	for _, cut := range []int{0, 2, 4, 5, 70000, len(whole) - 4, len(whole) - 1} {
		_, err := io.ReadAll(NewChunkReader(bytes.NewReader(whole[:cut])))
		if !errors.Is(err, ErrTransferCut) {
			t.Fatalf("stream cut at %d of %d: %v, want ErrTransferCut", cut, len(whole), err)
		}
	}
	over := binary.BigEndian.AppendUint32(nil, MaxChunk+1)
	if _, err := io.ReadAll(NewChunkReader(bytes.NewReader(over))); err == nil || !strings.Contains(err.Error(), strconv.Itoa(MaxChunk)) {
		t.Fatalf("oversized chunk: %v", err)
	}
}

// FuzzChunkReader: whatever the bytes, a ChunkReader never returns more
// than the stream holds, and it reports a clean end only when the stream
// is a sequence of valid chunks ending with the end marker.
func FuzzChunkReader(f *testing.F) {
	var ok bytes.Buffer
	cw := NewChunkWriter(&ok)
	cw.Write([]byte("hello"))
	cw.End()
	f.Add(ok.Bytes())
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 3, 'a'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, stream []byte) {
		back, err := io.ReadAll(NewChunkReader(bytes.NewReader(stream)))
		if len(back) > len(stream) {
			t.Fatalf("%d bytes out of a %d-byte stream", len(back), len(stream))
		}
		if err != nil {
			return
		}
		// A clean end: re-encoding what came out gives a prefix of the
		// input (the reader stops at the end marker).
		var again bytes.Buffer
		w := NewChunkWriter(&again)
		rest := stream
		for len(rest) > 0 {
			n := binary.BigEndian.Uint32(rest)
			if n == 0 {
				break
			}
			w.Write(rest[4 : 4+n])
			rest = rest[4+n:]
		}
		w.End()
		if !bytes.HasPrefix(stream, again.Bytes()) {
			t.Fatalf("clean end on a stream that is not chunks + end marker: %x", stream)
		}
	})
}

func TestStreamHeader(t *testing.T) {
	var buf bytes.Buffer
	WriteStreamHeader(&buf, StreamHeader{ID: 7, Which: StreamStdout})
	buf.WriteString("raw output")
	h, err := ReadStreamHeader(&buf)
	if err != nil || h.ID != 7 || h.Which != StreamStdout {
		t.Fatalf("%v %+v", err, h)
	}
	if buf.String() != "raw output" {
		t.Fatalf("the header reader consumed output: %q", buf.String())
	}
	for name, b := range map[string][]byte{
		"too long":  {0, 0, 1, 0},
		"short":     {0, 0, 0, 9, 0x80},
		"bad which": append([]byte{0, 0, 0, 17}, mustMarshal(t, StreamHeader{ID: 1, Which: "stdin"})...),
		"empty":     {},
	} {
		if _, err := ReadStreamHeader(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func mustMarshal(t *testing.T, h StreamHeader) []byte {
	b, err := h.MarshalMsg(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestValidateEnv(t *testing.T) {
	for _, k := range []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_", "BASH_ENV", "ENV", "IFS", "PS4", "PROMPT_COMMAND",
		"SHELLOPTS", "BASHOPTS", "GLOBIGNORE", "CDPATH", "BASH_FUNC_x%%", "", "A=B", "A\x00", strings.Repeat("K", MaxEnvKey+1)} {
		err := ValidateEnv(map[string]string{k: "v"})
		var we *Error
		if !errors.As(err, &we) || we.Code != CodeInvalid {
			t.Errorf("%q: want an invalid error, got %v", k, err)
			continue
		}
		if k != "" && len(k) < 64 && !strings.Contains(err.Error(), strings.TrimRight(k, "\x00")) {
			t.Errorf("%q: error does not name the key: %v", k, err)
		}
	}
	for _, k := range []string{"PATH", "HOME", "LANG", "ld_preload", "MY_LD_THING", "ENVIRONMENT", "A"} {
		if err := ValidateEnv(map[string]string{k: "v"}); err != nil {
			t.Errorf("%q refused: %v", k, err)
		}
	}
	if err := ValidateEnv(map[string]string{"A": "x\x00y"}); err == nil {
		t.Error("NUL in a value accepted")
	}
	if err := ValidateEnv(map[string]string{"A": strings.Repeat("v", MaxEnvValue+1)}); err == nil {
		t.Error("oversized value accepted")
	}
	many := map[string]string{}
	for i := range MaxEnvVars + 1 {
		many["K"+strings.Repeat("x", i)] = ""
	}
	if err := ValidateEnv(many); err == nil {
		t.Error("too many variables accepted")
	}
}

func TestValidateWake(t *testing.T) {
	seed := func(n int) []byte { return bytes.Repeat([]byte{7}, n) }
	for _, tc := range []struct {
		name string
		wake *Wake
		want string // "" = valid; else a fragment the error must hold
	}{
		{"minimal", &Wake{Seed: seed(MinWakeSeed)}, ""},
		{"largest", &Wake{ClockUnixNano: 1, Seed: seed(MaxWakeSeed)}, ""},
		{"no payload", nil, "no wake payload"},
		{"no seed", &Wake{}, "seed of 0 bytes"},
		{"short seed", &Wake{Seed: seed(MinWakeSeed - 1)}, "seed of 31 bytes"},
		{"long seed", &Wake{Seed: seed(MaxWakeSeed + 1)}, "seed of 513 bytes"},
		{"negative clock", &Wake{ClockUnixNano: -1, Seed: seed(MinWakeSeed)}, "clock -1 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateWake(tc.wake)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var we *Error
			if !errors.As(err, &we) || we.Code != CodeInvalid || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an invalid error naming %q", err, tc.want)
			}
		})
	}
}

func TestValidatePathAndExec(t *testing.T) {
	for _, p := range []string{"", "rel/path", "/a/../b", "/..", "/a\x00b", "/" + strings.Repeat("a", MaxPath)} {
		if ValidatePath(p) == nil {
			t.Errorf("path %q accepted", p)
		}
	}
	for _, p := range []string{"/", "/root/a.txt", "/a/./b", "//a//b/", "/a/..b/c..", "/weird name/ü"} {
		if err := ValidatePath(p); err != nil {
			t.Errorf("path %q refused: %v", p, err)
		}
	}
	bad := []*Exec{nil, {}, {Argv: []string{"a"}, Shell: "b"}, {Argv: []string{""}}, {Argv: []string{"a\x00"}},
		{Shell: "x", TimeoutMS: -1}, {Shell: "x", StdoutCap: MaxOutputCap + 1}, {Shell: "x", StderrCap: -1},
		{Shell: "x", Cwd: "tmp"}, {Shell: "x", Env: map[string]string{"LD_PRELOAD": "/x.so"}}}
	for i, e := range bad {
		if ValidateExec(e) == nil {
			t.Errorf("bad exec %d accepted: %+v", i, e)
		}
	}
	if err := ValidateExec(&Exec{Argv: []string{"true"}, Cwd: "/tmp", Env: map[string]string{"PATH": "/bin"}}); err != nil {
		t.Fatal(err)
	}
	if OutputCap(0) != MinOutputCap || OutputCap(1) != MinOutputCap || OutputCap(20<<20) != 20<<20 || OutputCap(MaxOutputCap*2) != MaxOutputCap {
		t.Fatal("OutputCap")
	}
	if err := ValidateBootConfig(&BootConfig{Hostname: "a b"}); err == nil {
		t.Fatal("hostname with a space accepted")
	}
	if err := ValidateBootConfig(&BootConfig{Files: []BootFile{{Path: "/x", Mode: 0o170000}}}); err == nil {
		t.Fatal("file type bits in a boot file mode accepted")
	}
}

func TestErrorIs(t *testing.T) {
	var err error = Errorf(CodeNotFound, "open /x: no such file")
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrExist) || err.Error() != "open /x: no such file" {
		t.Fatal(err)
	}
	if !errors.Is(Errorf(CodePermission, "p"), fs.ErrPermission) || !errors.Is(Errorf(CodeExists, "e"), fs.ErrExist) {
		t.Fatal("code mapping")
	}
}

// TestGeneratedCodeIsFresh regenerates the msgp code and compares it with
// the committed file, so a stale guestwire_gen.go fails the build.
func TestGeneratedCodeIsFresh(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile("guestwire.go")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "guestwire.go"), src, 0o644)
	cmd := exec.Command("go", "tool", "msgp", "-file", filepath.Join(dir, "guestwire.go"), "-o", filepath.Join(dir, "guestwire_gen.go"), "-tests=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("msgp: %v\n%s", err, out)
	}
	fresh, _ := os.ReadFile(filepath.Join(dir, "guestwire_gen.go"))
	committed, _ := os.ReadFile("guestwire_gen.go")
	if !bytes.Equal(fresh, committed) {
		t.Fatal("guestwire_gen.go is stale: run `go generate ./core/guestwire/` and commit the result")
	}
}

// TestGuestBuildIsCGOFree proves the package builds without cgo and links
// no sqlite: the guest agent imports it.
func TestGuestBuildIsCGOFree(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", ".")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, forbidden := range []string{"go-sqlite3", "core/ledger", "Code-Hex/vz"} {
		if strings.Contains(string(out), forbidden) {
			t.Errorf("guestwire depends on %s", forbidden)
		}
	}
}

func FuzzUnmarshalMessage(f *testing.F) {
	for _, m := range samples() {
		b, _ := m.MarshalMsg(nil)
		f.Add(b)
	}
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m Message
		if err := Unmarshal(data, &m); err != nil {
			return
		}
		// Whatever decodes must encode, and then survive further round
		// trips unchanged. (The first one may turn an empty slice into an
		// omitted one, so compare from the second on.)
		once := roundTrip(t, &m)
		twice := roundTrip(t, once)
		if !reflect.DeepEqual(once, twice) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", once, twice)
		}
	})
}

func roundTrip(t *testing.T, m *Message) *Message {
	b, err := m.MarshalMsg(nil)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	var back Message
	if _, err := back.UnmarshalMsg(b); err != nil {
		t.Fatalf("re-decode: %v", err)
	}
	return &back
}

func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, m := range samples() {
		w.Write(m)
	}
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 1, 0xc1, 0, 0, 0, 1, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		for range 64 {
			var m Message
			if err := r.Read(&m); err != nil && !IsRecoverable(err) {
				return
			}
		}
	})
}

func FuzzStreamHeader(f *testing.F) {
	var buf bytes.Buffer
	WriteStreamHeader(&buf, StreamHeader{ID: 1, Which: StreamStdout})
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadStreamHeader(bytes.NewReader(data))
		if err == nil && h.Which != StreamStdout && h.Which != StreamStderr {
			t.Fatalf("accepted output %q", h.Which)
		}
	})
}

// TestValidateSuspend: a wake marker of a suspend is refused outside its
// bounds, and without a payload.
func TestValidateSuspend(t *testing.T) {
	for _, tc := range []struct {
		s  *Suspend
		ok bool
	}{
		{nil, false},
		{&Suspend{}, false},
		{&Suspend{WakeMarker: make([]byte, MinWakeMarker-1)}, false},
		{&Suspend{WakeMarker: make([]byte, MinWakeMarker)}, true},
		{&Suspend{WakeMarker: make([]byte, MaxWakeMarker)}, true},
		{&Suspend{WakeMarker: make([]byte, MaxWakeMarker+1)}, false},
	} {
		if err := ValidateSuspend(tc.s); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.s, err)
		}
	}
}

// TestBootConfigVMID: a VM id outside its form is refused.
func TestBootConfigVMID(t *testing.T) {
	for id, ok := range map[string]bool{"": true, "vm-0123456789ab": true, "../etc": false, "VM": false, strings.Repeat("a", MaxVMID+1): false} {
		if err := ValidateBootConfig(&BootConfig{VMID: id}); (err == nil) != ok {
			t.Errorf("vm_id %q: %v", id, err)
		}
	}
}
