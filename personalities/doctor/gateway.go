package doctor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/mcpgw"
	"github.com/capsem/capsem/core/unixsock"
)

// gatewayTimeout bounds the whole gateway check: every configured server
// must connect within it (npx may first fetch a package).
const gatewayTimeout = 3 * time.Minute

// checkGateway starts a throwaway gateway with this host's configuration,
// in a scratch session, and drives it as a guest agent would: through the
// relay (capsem-mcp-server), with the MCP Go SDK's client: initialize,
// tools/list and a builtin call. Then it reports every configured server:
// its transport and tool count, or why it did not connect.
func (h *host) checkGateway(ctx context.Context, r *doctor.Reporter) {
	ctx, cancel := context.WithTimeout(ctx, gatewayTimeout)
	defer cancel()
	src, err := h.sources()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	dir, err := os.MkdirTemp("", "capsem-doctor-gw-")
	if err != nil {
		r.Failf("make the temporary directory writable", "%v", err)
		return
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "gw.sock")
	gw, err := mcpgw.Start(ctx, mcpgw.Options{SessionDir: filepath.Join(dir, "session"), Sources: src, Protect: []string{sock},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		r.Failf("see the config group: the gateway refuses a configuration it cannot enforce", "starting a gateway: %v", err)
		return
	}
	defer gw.Close()
	ln, err := unixsock.Listen(sock)
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	defer ln.Close()
	go gw.Serve(ctx, ln)

	relayCmd := exec.Command(h.self, "mcp-relay")
	relayCmd.Env = append(os.Environ(), envvars.MCPEndpoint.Pair("unix:"+sock))
	client := mcp.NewClient(&mcp.Implementation{Name: "capsem-doctor", Version: "1"}, nil)
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: relayCmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		r.Failf("", "initialize through the relay: %v", err)
		return
	}
	defer s.Close()
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		r.Failf("", "tools/list: %v", err)
		return
	}
	builtin := 0
	perServer := map[string]int{}
	for _, t := range tools.Tools {
		server, _, _ := strings.Cut(t.Name, "__")
		perServer[server]++
		if server == "builtin" {
			builtin++
		}
	}
	if builtin == 0 {
		r.Failf("a policy that blocks the builtin server hides its tools", "tools/list has %d tools, none of them builtin", len(tools.Tools))
		return
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "builtin__http_get", Arguments: map[string]any{"url": "http://127.0.0.1:9/"}})
	if err != nil || len(res.Content) == 0 {
		r.Failf("", "tools/call builtin__http_get: %v", err)
		return
	}
	r.Okf("%s answered initialize, tools/list (%d tools, %d builtin) and a builtin call", s.InitializeResult().ServerInfo.Name, len(tools.Tools), builtin)

	st, err := gw.Aggregator.Do(ctx, &aggwire.Request{Method: aggwire.MethodListServers})
	if err != nil {
		r.Failf("", "asking the aggregator for its servers: %v", err)
		return
	}
	for _, sv := range st.Servers {
		res := doctor.Result{Group: "gateway", Name: "server " + sv.Name}
		switch {
		case !sv.Enabled:
			res.Status, res.Detail = doctor.OK, fmt.Sprintf("%s: disabled in the configuration", sv.Transport)
		case !sv.Connected:
			res.Status, res.Hint = doctor.Fail, "check the server's command or URL and credentials in "+gw.Config().ServerSources[sv.Name]
			res.Detail = fmt.Sprintf("%s: did not connect: %s", sv.Transport, sv.Error)
		default:
			res.Status = doctor.OK
			res.Detail = fmt.Sprintf("%s: %d tools (%d listed after policy), %d resources, %d prompts", sv.Transport, sv.ToolCount, perServer[sv.Name], sv.ResourceCount, sv.PromptCount)
		}
		r.Add(res)
	}
}
