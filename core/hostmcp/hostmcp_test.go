package hostmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/logs"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fakeService answers as the service would, recording what it was asked.
type fakeService struct {
	mu         sync.Mutex
	calls      []string
	execReq    api.ExecRequest
	createIn   api.CreateRequest
	timelineIn api.TimelineRequest
	mcpIn      []api.MCPCallRequest
	block      chan struct{} // Exec waits on it (or ctx)
	execCtx    error         // why the blocked Exec ended
	// beat, when not nil, holds CreateStream in its first stage until it
	// is closed (the test closes it on seeing a heartbeat).
	beat chan struct{}
}

func (f *fakeService) note(s string) { f.mu.Lock(); f.calls = append(f.calls, s); f.mu.Unlock() }

var errUnknown = &apiclient.StatusError{Status: 404, Message: `no VM named "ghost" (see capsem_list)`}

func (f *fakeService) Version(context.Context) (api.Version, error) {
	return api.Version{Version: "9.9"}, nil
}
func (f *fakeService) List(context.Context) ([]api.VM, error) {
	return []api.VM{{ID: "vm-0123456789ab", Name: "keep", Persistent: true, State: api.StateStopped, VMConfig: api.VMConfig{RAMMB: 512, CPUs: 1}, Image: "default",
		CreatedAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}}, nil
}
func (f *fakeService) Create(_ context.Context, req api.CreateRequest) (api.VM, error) {
	f.mu.Lock()
	f.createIn = req
	f.mu.Unlock()
	var published []api.PortMapping
	for _, m := range req.Ports {
		published = append(published, m.Normalized())
	}
	return api.VM{ID: "vm-aaaaaaaaaaaa", Name: req.Name, State: api.StateRunning, VMConfig: req.VMConfig,
		Process: &api.Info{Accel: "tcg", BootTimings: map[string]int64{"total": 700}, Ports: published}}, nil
}
func (f *fakeService) Info(_ context.Context, vm string) (api.VM, error) {
	if vm == "ghost" {
		return api.VM{}, errUnknown
	}
	return api.VM{ID: vm}, nil
}
func (f *fakeService) Exec(ctx context.Context, vm string, req api.ExecRequest) (api.ExecResult, error) {
	f.mu.Lock()
	f.execReq = req
	block := f.block
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			f.mu.Lock()
			f.execCtx = ctx.Err()
			f.mu.Unlock()
			return api.ExecResult{}, ctx.Err()
		}
	}
	return api.ExecResult{Stdout: "out", Stderr: "err", ExitCode: 3, TimedOut: req.TimeoutMS > 0}, nil
}

// CreateStream reports the stages a first VM's start has: the assets'
// build, then the boot.
func (f *fakeService) CreateStream(ctx context.Context, req api.CreateRequest, stage func(string)) (api.VM, error) {
	stage("guest assets: building the initramfs")
	if f.beat != nil {
		select {
		case <-f.beat:
		case <-ctx.Done():
			return api.VM{}, ctx.Err()
		case <-time.After(30 * time.Second):
			return api.VM{}, errors.New("no heartbeat in 30 s")
		}
	}
	vm, err := f.Create(ctx, req)
	stage("booting under tcg")
	return vm, err
}

// progressRecorder collects progress messages, and closes beat on the
// first heartbeat.
func progressRecorder(beat chan struct{}) (*mcp.ClientOptions, func() string) {
	var mu sync.Mutex
	var msgs []string
	var once sync.Once
	opts := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		msgs = append(msgs, r.Params.Message)
		mu.Unlock()
		if strings.HasSuffix(r.Params.Message, "s)") {
			once.Do(func() { close(beat) })
		}
	}}
	return opts, func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(msgs, "|")
	}
}
func (f *fakeService) RunStream(ctx context.Context, req api.RunRequest, events api.RunEvents, stdout, stderr io.Writer) (*api.ExecEvent, error) {
	vm, _ := f.CreateStream(ctx, req.CreateRequest, events.Stage)
	defer f.note("run removed " + vm.ID) // the service's part
	events.Ready(vm)
	r, err := f.Exec(ctx, vm.ID, req.Exec)
	if err != nil {
		return nil, err
	}
	io.WriteString(stdout, r.Stdout)
	io.WriteString(stderr, r.Stderr)
	return &api.ExecEvent{Done: true, ExitCode: r.ExitCode, TimedOut: r.TimedOut}, nil
}
func (f *fakeService) Stop(_ context.Context, vm string) (api.VM, error) { return api.VM{ID: vm}, nil }
func (f *fakeService) Resume(_ context.Context, vm string, req api.ResumeRequest) (api.VM, error) {
	f.note(fmt.Sprintf("resume %s boot=%v", vm, req.Boot))
	return api.VM{ID: vm}, nil
}
func (f *fakeService) Suspend(_ context.Context, vm string) (api.VM, error) {
	f.note("suspend " + vm)
	return api.VM{ID: vm, State: api.StateSuspended}, nil
}
func (f *fakeService) Persist(_ context.Context, vm, name string) (api.VM, error) {
	return api.VM{ID: vm, Name: name, Persistent: true}, nil
}
func (f *fakeService) Delete(_ context.Context, vm string) error {
	f.note("delete " + vm)
	if vm == "tmpl" || vm == "nothing" {
		return &apiclient.StatusError{Status: 404, Code: api.CodeNotFound, Message: "no VM " + vm}
	}
	return nil
}
func (f *fakeService) Fork(_ context.Context, vm string, req api.ForkRequest) (api.Image, error) {
	f.note("fork " + vm + " " + req.Name)
	return api.Image{Name: req.Name, Source: api.ImageSource{ID: vm, State: "running"}, SizeBytes: 1 << 20}, nil
}
func (f *fakeService) Images(context.Context) ([]api.Image, error) {
	return []api.Image{{Name: "tmpl", Base: api.BaseFull, Source: api.ImageSource{ID: "vm-0123456789ab", State: "stopped"}}}, nil
}
func (f *fakeService) DeleteImage(_ context.Context, name string) error {
	f.note("delete image " + name)
	if name != "tmpl" {
		return &apiclient.StatusError{Status: 404, Code: api.CodeNotFound, Message: "no image " + name}
	}
	return nil
}
func (f *fakeService) Purge(context.Context, bool) (api.PurgeResult, error) {
	return api.PurgeResult{Removed: []string{}}, nil
}
func (f *fakeService) ReadFile(context.Context, string, api.ReadFileRequest) (api.ReadFileResult, error) {
	return api.ReadFileResult{Content: "x", Encoding: "utf8", Size: 1}, nil
}
func (f *fakeService) WriteFile(context.Context, string, api.WriteFileRequest) error { return nil }
func (f *fakeService) Logs(context.Context, string, int, string) (api.LogsResult, error) {
	return api.LogsResult{Serial: "boot\n"}, nil
}
func (f *fakeService) ServiceLogs(context.Context, int, string) (api.LogsResult, error) {
	return api.LogsResult{Service: "{}\n"}, nil
}
func (f *fakeService) Schema(context.Context, string) (api.SchemaResult, error) {
	return api.SchemaResult{Tables: []string{"CREATE TABLE t (x)"}}, nil
}
func (f *fakeService) Inspect(context.Context, string, api.InspectRequest) (api.InspectResult, error) {
	return api.InspectResult{Columns: []string{"n"}, Rows: [][]any{{1.0}}}, nil
}

func (f *fakeService) Timeline(_ context.Context, vm string, req api.TimelineRequest) (api.TimelineResult, error) {
	if vm == "ghost" {
		return api.TimelineResult{}, errUnknown
	}
	f.mu.Lock()
	f.timelineIn = req
	f.mu.Unlock()
	return api.TimelineResult{Events: []api.TimelineEvent{{Timestamp: "2026-12-03T12:00:00.000000000Z", Layer: api.LayerExec, ID: 1, TraceID: "t1", Summary: "api: true → exit 0 (1 ms)"}}, Omitted: 4}, nil
}

func (f *fakeService) MCP(_ context.Context, vm string, req api.MCPCallRequest) (api.MCPCallResult, error) {
	f.mu.Lock()
	f.mcpIn = append(f.mcpIn, req)
	f.mu.Unlock()
	switch {
	case req.Method == "tools/list":
		return api.MCPCallResult{Result: json.RawMessage(`{"tools":[{"name":"everything__echo","description":"echoes","inputSchema":{"type":"object"}},{"name":"builtin__http_get","inputSchema":{"type":"object"}}]}`)}, nil
	case strings.Contains(string(req.Params), "blocked__"):
		return api.MCPCallResult{Error: &api.MCPError{Code: -32600, Message: "tools/call denied by policy: rule no-blocked"}}, nil
	}
	return api.MCPCallResult{Result: json.RawMessage(`{"content":[{"type":"text","text":"Echo: hi"}]}`)}, nil
}

func (f *fakeService) Panics(_ context.Context, req api.PanicsRequest) (api.PanicsResult, error) {
	return api.PanicsResult{Panics: []api.PanicReport{{Panic: logs.Panic{Time: "2026-12-03T12:00:00Z", Message: "boom", Location: "main.main() ~/x.go:1", Frames: []string{"main.main() ~/x.go:1"}},
		Component: "process", VM: "vm-0123456789ab", Log: "~/.capsem/run/sessions/vm-0123456789ab/process.log"}}, Omitted: 2}, nil
}

func (f *fakeService) Triage(_ context.Context, req api.TriageRequest) (api.TriageResult, error) {
	if req.VM == "ghost" {
		return api.TriageResult{}, errUnknown
	}
	return api.TriageResult{Since: "2026-12-02T12:00:00Z", Findings: []api.TriageFinding{{Severity: api.SeverityCritical, Kind: api.FindingPanic, Summary: "process crashed: boom", Count: 2, Source: "~/x.log"}}}, nil
}

func (f *fakeService) MCPServers(_ context.Context, vm string) (api.MCPServersResult, error) {
	return api.MCPServersResult{Servers: []api.MCPServer{{Name: "everything", Transport: "stdio", Enabled: true, Connected: true, Tools: 13}}}, nil
}

func connect(t *testing.T, svc Service, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := New(svc, "9.9").Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestToolsListGolden pins every tool's name, description, schemas and
// annotations (testdata/hostmcp/tools.json; -update rewrites it).
func TestToolsListGolden(t *testing.T) {
	cs := connect(t, &fakeService{}, nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(res.Tools, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "testdata", "hostmcp", "tools.json")
	if *update {
		os.WriteFile(path, append(got, '\n'), 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden missing (run with -update): %v", err)
	}
	if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
		t.Fatalf("tools/list changed (run with -update if intended):\n%s", got)
	}
	if len(res.Tools) != 26 {
		t.Errorf("%d tools, want 26", len(res.Tools))
	}
	// The TypeScript SDK refuses a tool whose schema gives a property as
	// a bare true (what a Go field of type any becomes).
	var propertiesAreSchemas func(path string, schema any)
	propertiesAreSchemas = func(path string, schema any) {
		m, _ := schema.(map[string]any)
		props, _ := m["properties"].(map[string]any)
		for name, p := range props {
			if _, ok := p.(map[string]any); !ok {
				t.Errorf("%s.%s: the schema %v is not an object", path, name, p)
			}
			propertiesAreSchemas(path+"."+name, p)
		}
		if items, ok := m["items"].(map[string]any); ok {
			propertiesAreSchemas(path+"[]", items)
		}
	}
	var tools []map[string]any
	json.Unmarshal(got, &tools)
	for _, tool := range tools {
		propertiesAreSchemas(fmt.Sprint(tool["name"], ".in"), tool["inputSchema"])
		propertiesAreSchemas(fmt.Sprint(tool["name"], ".out"), tool["outputSchema"])
	}
	for _, tool := range res.Tools {
		if tool.Annotations == nil || tool.OutputSchema == nil || tool.InputSchema == nil || len(tool.Description) < 40 {
			t.Errorf("%s lacks annotations, schemas or a description an agent can act on", tool.Name)
		}
	}
	if init := cs.InitializeResult(); !strings.Contains(init.Instructions, "capsem_inspect") {
		t.Errorf("instructions: %q", init.Instructions)
	}
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// TestCreatePublishesPorts: capsem_create's ports reach the service as
// the create request's, and the VM comes back with them, addresses filled.
func TestCreatePublishesPorts(t *testing.T) {
	f := &fakeService{}
	cs := connect(t, f, nil)
	res := call(t, cs, "capsem_create", map[string]any{"ports": []map[string]any{{"host": 8080, "guest": 3000}, {"address": "0.0.0.0", "host": 9090, "guest": 80}}})
	if res.IsError {
		t.Fatalf("create: %+v", res.Content[0])
	}
	f.mu.Lock()
	got := f.createIn.Ports
	f.mu.Unlock()
	if want := []api.PortMapping{{Host: 8080, Guest: 3000}, {Address: "0.0.0.0", Host: 9090, Guest: 80}}; !slices.Equal(got, want) {
		t.Fatalf("the service was asked for %+v, want %+v", got, want)
	}
	var out VMOut
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if want := []PortOut{{"127.0.0.1", 8080, 3000}, {"0.0.0.0", 9090, 80}}; !slices.Equal(out.Ports, want) {
		t.Fatalf("ports out %+v, want %+v", out.Ports, want)
	}
	// A port without its guest side is refused by the schema.
	if res := call(t, cs, "capsem_create", map[string]any{"ports": []map[string]any{{"host": 8080}}}); !res.IsError {
		t.Fatalf("a port without guest: %+v", res)
	}
}

func TestToolsTranslate(t *testing.T) {
	f := &fakeService{}
	cs := connect(t, f, nil)
	// A service refusal is a tool error with the service's message.
	res := call(t, cs, "capsem_info", map[string]any{"id": "ghost"})
	if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, `no VM named "ghost"`) {
		t.Fatalf("unknown VM: %+v", res)
	}
	// Structured results, also as JSON text.
	res = call(t, cs, "capsem_exec", map[string]any{"id": "vm-1", "command": "false", "timeout": 2, "env": map[string]string{"A": "1"}, "workdir": "/tmp"})
	var out ExecOut
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &out)
	if res.IsError || out.ExitCode != 3 || out.Stdout != "out" || out.Stderr != "err" || !out.TimedOut {
		t.Fatalf("exec: %+v %+v", res, out)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; !strings.Contains(text, `"exitCode":3`) {
		t.Errorf("text content: %s", text)
	}
	if f.execReq.TimeoutMS != 2000 || f.execReq.Command != "false" || f.execReq.Cwd != "/tmp" || f.execReq.Env["A"] != "1" {
		t.Errorf("the service got %+v", f.execReq)
	}
	// No timeout unless given.
	call(t, cs, "capsem_exec", map[string]any{"id": "vm-1", "command": "true"})
	if f.execReq.TimeoutMS != 0 {
		t.Errorf("a default timeout of %d ms", f.execReq.TimeoutMS)
	}
	// Schema validation refuses bad input before the service sees it.
	for _, bad := range []map[string]any{
		{"command": "true"},          // no id
		{"id": "vm-1", "command": 7}, // wrong type
		{"id": "vm-1", "command": "true", "timeout": -1},
		{"id": "vm-1", "command": "true", "bogus": 1},
	} {
		res := call(t, cs, "capsem_exec", bad)
		if !res.IsError {
			t.Errorf("exec %v was accepted", bad)
		}
	}
	res = call(t, cs, "capsem_version", map[string]any{})
	b, _ = json.Marshal(res.StructuredContent)
	var v VersionOut
	json.Unmarshal(b, &v)
	if !v.Match || !v.ServiceReachable || v.MCPVersion != "9.9" {
		t.Errorf("version: %+v", v)
	}
	res = call(t, cs, "capsem_list", map[string]any{})
	if b, _ := json.Marshal(res.StructuredContent); !strings.Contains(string(b), `"name":"keep"`) || !strings.Contains(string(b), `"state":"stopped"`) ||
		!strings.Contains(string(b), `"images":[{"base":"full"`) || !strings.Contains(string(b), `"name":"tmpl"`) {
		t.Errorf("list: %s", b)
	}
}

// TestForkAndDeleteImage: capsem_fork passes its arguments on; capsem_delete
// deletes a VM, else the image of that name, else says neither exists.
func TestForkAndDeleteImage(t *testing.T) {
	f := &fakeService{}
	cs := connect(t, f, nil)
	res := call(t, cs, "capsem_fork", map[string]any{"id": "dev", "name": "snap", "description": "after npm i"})
	if b, _ := json.Marshal(res.StructuredContent); res.IsError || !strings.Contains(string(b), `"name":"snap"`) || !strings.Contains(string(b), `"sourceId":"dev"`) {
		t.Errorf("fork: %s", b)
	}
	if res := call(t, cs, "capsem_fork", map[string]any{"id": "dev"}); !res.IsError {
		t.Error("a fork without a name was accepted")
	}
	res = call(t, cs, "capsem_delete", map[string]any{"id": "tmpl"})
	if b, _ := json.Marshal(res.StructuredContent); res.IsError || string(b) != `{"deleted":"tmpl","image":true}` {
		t.Errorf("delete of an image: %s", b)
	}
	res = call(t, cs, "capsem_delete", map[string]any{"id": "nothing"})
	if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, `no VM or image is named "nothing"`) {
		t.Errorf("delete of nothing: %v", res.Content)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if want := []string{"fork dev snap", "delete tmpl", "delete image tmpl", "delete nothing", "delete image nothing"}; !slices.Equal(f.calls, want) {
		t.Errorf("calls %q, want %q", f.calls, want)
	}
}

// TestCreateSendsProgress: with a progress token, a create reports its
// stages and that it is alive while the VM boots.
func TestCreateSendsProgress(t *testing.T) {
	f := &fakeService{beat: make(chan struct{})}
	opts, progress := progressRecorder(f.beat)
	cs := connect(t, f, opts)
	params := &mcp.CallToolParams{Name: "capsem_create", Arguments: map[string]any{"name": "dev", "ramMb": 512, "cpuCount": 1}}
	params.SetProgressToken("tok-1")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("create: %v %+v", err, res)
	}
	// Each stage as it begins, the heartbeat repeating the one under way
	// with its time so far; notifications may trail the result.
	want := regexp.MustCompile(`^creating the VM\|guest assets: building the initramfs(\|guest assets: building the initramfs \(\d+s\))+\|booting under tcg(\|booting under tcg \(\d+s\))*\|ready$`)
	deadline := time.Now().Add(5 * time.Second)
	for !want.MatchString(progress()) {
		if time.Now().After(deadline) {
			t.Fatalf("progress: %q", progress())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCancelReachesTheService: a client's notifications/cancelled for a
// running exec cancels the service call (which kills the guest command).
func TestCancelReachesTheService(t *testing.T) {
	f := &fakeService{block: make(chan struct{})}
	cs := connect(t, f, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "capsem_exec", Arguments: map[string]any{"id": "vm-1", "command": "sleep 1000"}})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the call ended with %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		why := f.execCtx
		f.mu.Unlock()
		if errors.Is(why, context.Canceled) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the service's exec was not cancelled")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunStagesAndCleanup: capsem_run reports its stages (boot, then the
// command) and returns the command's result; it leaves the VM to the
// service (which removes it), also when the call is cancelled, which ends
// the service's run.
func TestRunStagesAndCleanup(t *testing.T) {
	f := &fakeService{beat: make(chan struct{})}
	opts, progress := progressRecorder(f.beat)
	cs := connect(t, f, opts)
	params := &mcp.CallToolParams{Name: "capsem_run", Arguments: map[string]any{"command": "echo hi"}}
	params.SetProgressToken(7)
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("run: %v %+v", err, res)
	}
	want := regexp.MustCompile(`^creating a temporary VM\|guest assets: building the initramfs(\|guest assets: building the initramfs \(\d+s\))+\|booting under tcg(\|booting under tcg \(\d+s\))*\|running the command in vm-aaaaaaaaaaaa(\|running the command in vm-aaaaaaaaaaaa \(\d+s\))*$`)
	deadline := time.Now().Add(5 * time.Second)
	for !want.MatchString(progress()) {
		if time.Now().After(deadline) {
			t.Fatalf("stages: %q, want the VM's stages first, with a heartbeat", progress())
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.mu.Lock()
	calls := strings.Join(f.calls, ",")
	f.mu.Unlock()
	if calls != "run removed vm-aaaaaaaaaaaa" {
		t.Fatalf("the service saw %q, want one run and no other call", calls)
	}
	var out ExecOut
	if b, _ := json.Marshal(res.StructuredContent); json.Unmarshal(b, &out) != nil || out.Stdout != "out" || out.Stderr != "err" || out.ExitCode != 3 {
		t.Errorf("run result %+v", res.StructuredContent)
	}

	// Cancelled while its command runs: the VM is still removed.
	g := &fakeService{block: make(chan struct{})}
	cs = connect(t, g, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "capsem_run", Arguments: map[string]any{"command": "sleep 1000"}})
		done <- err
	}()
	for {
		g.mu.Lock()
		started := g.execReq.Command != ""
		g.mu.Unlock()
		if started {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	deadline = time.Now().Add(5 * time.Second)
	for {
		g.mu.Lock()
		calls := strings.Join(g.calls, ",")
		g.mu.Unlock()
		if calls == "run removed vm-aaaaaaaaaaaa" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a cancelled run the service saw %q", calls)
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.execCtx == nil {
		t.Error("the cancelled call did not end the service's run")
	}
}

// TestCreateTakesEveryVMSetting: each setting of api.VMConfig is an
// argument of capsem_create under its camelCase name (cpuCount as the
// seed spells it) and reaches the service as the create request's; an
// argument capsem_create does not have is refused, naming it.
func TestCreateTakesEveryVMSetting(t *testing.T) {
	f := &fakeService{}
	cs := connect(t, f, nil)
	args := map[string]any{"name": "dev", "image": "default", "cpuCount": 3, "ramMb": 768, "diskGb": 0, "base": "minimal",
		"workspace": "/srv/project", "workspaceMib": 64, "config": "/etc/vm.toml", "noAutodetect": true, "noNetwork": true,
		"netMtu": 1500, "env": map[string]string{"A": "1"}}
	if res := call(t, cs, "capsem_create", args); res.IsError {
		t.Fatalf("create: %+v", res.Content[0])
	}
	f.mu.Lock()
	got := f.createIn
	f.mu.Unlock()
	want := api.CreateRequest{Name: "dev", Image: "default", VMConfig: api.VMConfig{CPUs: 3, RAMMB: 768, DiskGB: new(0), Base: "minimal",
		Workspace: "/srv/project", WorkspaceMiB: 64, Config: "/etc/vm.toml", NoAutodetect: true, NoNetwork: true, NetMTU: 1500, Env: map[string]string{"A": "1"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the service was asked for\n%+v, want\n%+v", got, want)
	}
	// Every setting was given above: a new one must be added to this test.
	if n := len(vmConfigArgs()); n != len(args)-2+1 { // less name and image, plus ports (TestCreatePublishesPorts)
		t.Errorf("api.VMConfig has %d settings; this test gives %d", n, len(args)-2+1)
	}
	for _, bad := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"cpus": 2}, "cpus"},       // the API's spelling, not the MCP wire's
		{map[string]any{"ram_mb": 512}, "ram_mb"}, // likewise
		{map[string]any{"config_version": 9}, "config_version"},
		{map[string]any{"base": "ubuntu"}, "base"},
		{map[string]any{"ramMb": "lots"}, "ramMb"},
	} {
		res := call(t, cs, "capsem_create", bad.args)
		if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, bad.want) {
			t.Errorf("capsem_create %v: %+v, want an error naming %s", bad.args, res.Content, bad.want)
		}
	}
}

// FuzzCreateIn: capsem_create's arguments from any client never panic the
// decoder, and what it accepts is a configuration that encodes and
// decodes again to the same.
func FuzzCreateIn(f *testing.F) {
	for _, s := range []string{`{}`, `{"name":"dev","cpuCount":2,"ramMb":512,"diskGb":0}`, `{"env":{"A":"1"},"ports":[{"host":1,"guest":2}]}`,
		`{"cpus":1}`, `{"ports":["1:2"]}`, `{"ports":[{"host":1,"guest":2,"x":1}]}`, `[]`, `{"name":1}`, `{"diskGb":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in CreateIn
		if json.Unmarshal(b, &in) != nil {
			return
		}
		again, err := json.Marshal(in.VMConfig)
		if err != nil {
			t.Fatalf("%+v: %v", in.VMConfig, err)
		}
		var back api.VMConfig
		if err := json.Unmarshal(again, &back); err != nil {
			t.Fatalf("%s: %v", again, err)
		}
		if !reflect.DeepEqual(normalizeEmpty(back), normalizeEmpty(in.VMConfig)) {
			t.Fatalf("%s decoded to %+v, again %+v", b, in.VMConfig, back)
		}
	})
}

// normalizeEmpty drops empty maps and lists, which omitempty drops too.
func normalizeEmpty(c api.VMConfig) api.VMConfig {
	if len(c.Env) == 0 {
		c.Env = nil
	}
	if len(c.Ports) == 0 {
		c.Ports = nil
	}
	return c
}

// TestTimelineTool: capsem_timeline's filters reach the service (since as
// a time or a duration back from now), its events come back as the
// service gave them, and a bad since or an unknown VM is a tool error
// naming it.
func TestTimelineTool(t *testing.T) {
	f := &fakeService{}
	cs := connect(t, f, nil)
	res := call(t, cs, "capsem_timeline", map[string]any{"id": "dev", "traceId": "t1", "since": "15m", "layers": []string{"exec", "mcp"}, "limit": 5})
	if res.IsError {
		t.Fatalf("timeline: %+v", res.Content[0])
	}
	f.mu.Lock()
	got := f.timelineIn
	f.mu.Unlock()
	if ago := time.Since(got.Since); got.TraceID != "t1" || got.Limit != 5 || !slices.Equal(got.Layers, []string{"exec", "mcp"}) || ago < 15*time.Minute || ago > 16*time.Minute {
		t.Fatalf("the service was asked for %+v", got)
	}
	var out TimelineOut
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Events) != 1 || out.Events[0].Layer != "exec" || out.Events[0].TraceID != "t1" || out.Omitted != 4 {
		t.Fatalf("out %+v", out)
	}
	for _, bad := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"id": "dev", "since": "yesterday"}, `since "yesterday"`},
		{map[string]any{"id": "ghost"}, `no VM named "ghost"`},
	} {
		res := call(t, cs, "capsem_timeline", bad.args)
		if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, bad.want) {
			t.Errorf("%v: %+v, want an error naming %s", bad.args, res.Content, bad.want)
		}
	}
}

// TestHostLogsTakeNamesOnly: capsem_host_logs reads the service's and its
// own log by name, grep, tail and maxBytes applied; every path trick is
// refused naming the allowed names, and reads nothing.
func TestHostLogsTakeNamesOnly(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CAPSEM_RUN_DIR", dir)
	os.WriteFile(filepath.Join(dir, "service.log"), []byte("{\"msg\":\"one\"}\n{\"msg\":\"VM running\"}\n{\"msg\":\"three\"}\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("sk-secret\n"), 0o600)
	cs := connect(t, &fakeService{}, nil)
	var out HostLogsOut
	get := func(args map[string]any) {
		t.Helper()
		res := call(t, cs, "capsem_host_logs", args)
		if res.IsError {
			t.Fatalf("%v: %+v", args, res.Content[0])
		}
		b, _ := json.Marshal(res.StructuredContent)
		out = HostLogsOut{}
		json.Unmarshal(b, &out)
	}
	get(map[string]any{"name": "service", "grep": "VM running"})
	if out.Text != "{\"msg\":\"VM running\"}\n" || out.Truncated {
		t.Fatalf("grep: %+v", out)
	}
	get(map[string]any{"name": "service", "maxBytes": 20})
	if out.Text != "{\"msg\":\"three\"}\n" || !out.Truncated {
		t.Fatalf("maxBytes: %+v", out)
	}
	get(map[string]any{"name": "mcp"}) // nothing logged yet: empty, not an error
	if out.Text != "" {
		t.Fatalf("mcp: %+v", out)
	}
	for _, name := range []string{"../run/service.log", "/etc/passwd", filepath.Join(dir, "secret.txt"), "secret.txt", "service.log", "service/../secret.txt", "SERVICE", "service\x00", ""} {
		res := call(t, cs, "capsem_host_logs", map[string]any{"name": name})
		text := res.Content[0].(*mcp.TextContent).Text
		if !res.IsError || !strings.Contains(text, "want one of mcp, service (a name, not a path)") || strings.Contains(text, "sk-secret") {
			t.Errorf("name %q: %q", name, text)
		}
	}
	if res := call(t, cs, "capsem_host_logs", map[string]any{"name": "service", "maxBytes": 2 << 20}); !res.IsError {
		t.Error("maxBytes past the bound accepted")
	}
}

// TestPolicedMCPTools: capsem_mcp_tools filters the gateway's listing by
// server, capsem_mcp_call sends a namespaced tools/call with its arguments
// and trace and returns the tool's content; an unnamespaced name is
// refused before anything is sent, and the gateway's refusal (policy) is
// a tool error with its message.
func TestPolicedMCPTools(t *testing.T) {
	f := &fakeService{}
	cs := connect(t, f, nil)
	var servers MCPServersOut
	res := call(t, cs, "capsem_mcp_servers", map[string]any{"id": "dev"})
	b, _ := json.Marshal(res.StructuredContent)
	if json.Unmarshal(b, &servers); len(servers.Servers) != 1 || servers.Servers[0].Tools != 13 {
		t.Fatalf("servers: %+v", res)
	}
	var tools MCPToolsOut
	res = call(t, cs, "capsem_mcp_tools", map[string]any{"id": "dev", "server": "everything"})
	b, _ = json.Marshal(res.StructuredContent)
	if json.Unmarshal(b, &tools); len(tools.Tools) != 1 || tools.Tools[0].Name != "everything__echo" {
		t.Fatalf("tools of everything: %+v", res)
	}
	var out MCPCallOut
	res = call(t, cs, "capsem_mcp_call", map[string]any{"id": "dev", "name": "everything__echo", "args": map[string]any{"message": "hi"}, "traceId": "t-9"})
	b, _ = json.Marshal(res.StructuredContent)
	if json.Unmarshal(b, &out); res.IsError || !strings.Contains(fmt.Sprint(out.Content), "Echo: hi") {
		t.Fatalf("call: %+v", res)
	}
	f.mu.Lock()
	last := f.mcpIn[len(f.mcpIn)-1]
	sent := len(f.mcpIn)
	f.mu.Unlock()
	if last.Method != "tools/call" || last.TraceID != "t-9" || string(last.Params) != `{"arguments":{"message":"hi"},"name":"everything__echo"}` {
		t.Fatalf("sent %+v (%s)", last, last.Params)
	}
	for _, bad := range []struct {
		name, want string
	}{
		{"echo", `name "echo" is not namespaced`},
		{"__echo", "not namespaced"},
		{"everything__", "not namespaced"},
	} {
		res := call(t, cs, "capsem_mcp_call", map[string]any{"id": "dev", "name": bad.name})
		if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, bad.want) {
			t.Errorf("%s: %+v", bad.name, res.Content)
		}
	}
	f.mu.Lock()
	if len(f.mcpIn) != sent {
		t.Errorf("an unnamespaced name reached the service")
	}
	f.mu.Unlock()
	res = call(t, cs, "capsem_mcp_call", map[string]any{"id": "dev", "name": "blocked__tool"})
	if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "denied by policy: rule no-blocked") {
		t.Fatalf("a blocked call: %+v", res.Content)
	}
}
