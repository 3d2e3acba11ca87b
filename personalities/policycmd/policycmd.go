// Package policycmd is `capsem policy`: show the merged MCP and network
// policy and where each entry came from, explain a decision, and reload
// every running gateway and VM.
package policycmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/exitcode"
	"github.com/capsem/capsem/core/mcpgw"
	"github.com/capsem/capsem/core/mcpuri"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/policy"
	"github.com/capsem/capsem/core/reloadctl"
	"github.com/capsem/capsem/core/vmrecord"
)

// Cmd is `capsem policy`.
type Cmd struct {
	Check   CheckCmd   `cmd:"" help:"Print the merged policy and where each entry came from."`
	Explain ExplainCmd `cmd:"" help:"Print the decision policy makes for one call or URL, and the rule that makes it."`
	Reload  ReloadCmd  `cmd:"" help:"Reload configuration and policy in every running gateway and VM."`
}

// sourceFlags select the configuration hierarchy, as the gateway does.
type sourceFlags struct {
	Config       string `optional:"" type:"path" help:"Use this file as the user layer instead of $CAPSEM_HOME/user.toml."`
	NoAutodetect bool   `help:"Leave out the mcpServers of Claude Code and Gemini CLI settings."`
}

func (f sourceFlags) load() (*config.Merged, error) {
	src, err := mcpgw.SourcesFor(f.Config, !f.NoAutodetect)
	if err != nil {
		return nil, err
	}
	return config.LoadHierarchy(src)
}

// CheckCmd is `capsem policy check`.
type CheckCmd struct {
	sourceFlags
}

// Run loads and validates every source and prints the result.
func (c *CheckCmd) Run(context.Context) error {
	m, err := c.load()
	if err != nil {
		return err
	}
	Print(os.Stdout, m)
	return nil
}

// Print writes a merged configuration with the provenance of every entry.
func Print(w io.Writer, m *config.Merged) {
	p := m.Policy
	src := func(rank policy.Rank, path string) string {
		if path == "" {
			return "(" + rank.String() + ")"
		}
		return "(" + rank.String() + ": " + path + ")"
	}
	rankOf := map[string]policy.Rank{}
	for _, l := range m.Layers {
		rankOf[l.Path] = l.Rank
	}
	fmt.Fprintln(w, "Sources, highest precedence first:")
	if len(m.Layers) == 0 {
		fmt.Fprintln(w, "  (none: built-in defaults)")
	}
	for _, l := range m.Layers {
		fmt.Fprintf(w, "  %-13s %s\n", l.Rank, l.Path)
	}
	fmt.Fprintf(w, "\nDefault: %s %s\n", p.Default.Decision, src(p.Default.Rank, p.Default.Source))
	fmt.Fprintln(w, "\nBlocked servers:")
	if len(p.BlockedServers) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, s := range slices.Sorted(maps.Keys(p.BlockedServers)) {
		fmt.Fprintf(w, "  %s %s\n", s, src(rankOf[p.BlockedServers[s]], p.BlockedServers[s]))
	}
	fmt.Fprintln(w, "\nAllowed servers:")
	if len(p.AllowedServers) == 0 {
		fmt.Fprintln(w, "  (any server not blocked)")
	}
	for _, s := range slices.Sorted(maps.Keys(p.AllowedServers)) {
		fmt.Fprintf(w, "  %q %s\n", s, src(rankOf[p.AllowedServers[s]], p.AllowedServers[s]))
	}
	fmt.Fprintln(w, "\nPer-tool decisions:")
	if len(p.Tools) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, name := range slices.Sorted(maps.Keys(p.Tools)) {
		e := p.Tools[name]
		fmt.Fprintf(w, "  %s = %s %s\n", name, e.Decision, src(e.Rank, e.Source))
	}
	fmt.Fprintln(w, "\nContent rules (a matching block always wins; an allow relaxes only decisions of its own rank or lower):")
	if len(p.Rules) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, r := range p.Rules {
		fmt.Fprintf(w, "  %s: %s %s %s\n", r.Name, r.Action, describeRule(&r), src(r.Rank, r.Source))
	}
	fmt.Fprintln(w, "\nServers (builtin is always present unless policy blocks it):")
	if len(m.File.MCP.Servers) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, def := range m.File.ServerDefs() {
		if def.Builtin {
			continue
		}
		transport := "stdio: " + strings.Join(append([]string{def.Command}, def.Args...), " ")
		if def.URL != "" {
			transport = "http: " + def.URL
		}
		state := ""
		if !def.Enabled {
			state = " [not started: disabled or blocked]"
		}
		path := m.ServerSources[def.Name]
		fmt.Fprintf(w, "  %s  %s %s%s\n", def.Name, transport, src(rankOf[path], path), state)
	}
	printNet(w, m, src, rankOf)
	if len(m.Notes) > 0 {
		fmt.Fprintln(w, "\nNotes:")
		for _, n := range m.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
}

// printNet writes the [net] entries, each with its file and what limits it.
func printNet(w io.Writer, m *config.Merged, src func(policy.Rank, string) string, rankOf map[string]policy.Rank) {
	fmt.Fprintln(w, "\nNetwork ([net]; a lower file can only tighten a higher one):")
	if m.Net == nil {
		fmt.Fprintln(w, "  (none)")
		return
	}
	for _, e := range m.Net.Entries() {
		rank := policy.RankBuiltin
		if e.Source != "" {
			rank = rankOf[e.Source]
		}
		fmt.Fprintf(w, "  %-17s %s %s", e.Key, e.Value, src(rank, e.Source))
		if e.Note != "" {
			fmt.Fprintf(w, " [%s]", e.Note)
		}
		fmt.Fprintln(w)
	}
	// A credential whose value cannot be read fails every request to its
	// host: say so now. (A source_env is read from the service's
	// environment, which may not be this command's.)
	for _, c := range m.Net.Credentials() {
		if c.SourceFile == "" {
			continue
		}
		if _, err := c.ReadSecret(); err != nil {
			fmt.Fprintf(w, "  %-17s %s: cannot be read: %v\n", "", c.Host, err)
		}
	}
}

func describeRule(r *policy.Rule) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("tool", r.Tool)
	add("resource_uri", r.ResourceURI)
	add("argument", r.Argument)
	add("equals", string(r.Equals))
	if r.Matches != nil {
		add("matches", fmt.Sprintf("%q", r.Matches.String()))
	}
	add("returns", r.Returns)
	add("returns_equals", string(r.ReturnsEquals))
	if r.ReturnsMatches != nil {
		add("returns_matches", fmt.Sprintf("%q", r.ReturnsMatches.String()))
	}
	return strings.Join(parts, " ")
}

// ExplainCmd is `capsem policy explain`.
type ExplainCmd struct {
	sourceFlags
	Server   string `help:"Server name (its namespace); needed with --tool, --prompt and --resource."`
	Tool     string `xor:"target" help:"Tool name, bare or namespaced (server__tool)."`
	Prompt   string `xor:"target" help:"Prompt name, bare or namespaced."`
	Resource string `xor:"target" help:"Resource URI as the server knows it, or namespaced (capsem://server/...)."`
	URL      string `name:"url" xor:"target" help:"A URL the guest would connect to: the network policy's decision on its host and port."`
	Args     string `default:"{}" help:"The call's arguments, a JSON object."`
	Result   string `help:"A result to evaluate the response-phase rules on (JSON)."`
}

// Run prints the request verdict (and the response verdict with --result),
// or with --url the network policy's verdict.
func (c *ExplainCmd) Run(ctx context.Context) error {
	if c.URL != "" {
		target, err := parseURLTarget(c.URL)
		if err != nil {
			return err
		}
		m, err := c.load()
		if err != nil {
			return err
		}
		ExplainURL(os.Stdout, m, target)
		return nil
	}
	if c.Tool == "" && c.Prompt == "" && c.Resource == "" {
		return errors.New("name one of --tool, --prompt, --resource or --url")
	}
	if c.Server == "" {
		return errors.New("--server is required with --tool, --prompt and --resource")
	}
	if !json.Valid([]byte(c.Args)) || strings.TrimSpace(c.Args)[0] != '{' {
		return fmt.Errorf("--args %q: want a JSON object", c.Args)
	}
	m, err := c.load()
	if err != nil {
		return err
	}
	call := &policy.Call{Server: c.Server}
	namespaced := func(name string) string {
		if strings.HasPrefix(name, c.Server+"__") {
			return name
		}
		return c.Server + "__" + name
	}
	switch {
	case c.Tool != "":
		call.Method, call.Name, call.Arguments = "tools/call", namespaced(c.Tool), json.RawMessage(c.Args)
	case c.Prompt != "":
		call.Method, call.Name, call.Arguments = "prompts/get", namespaced(c.Prompt), json.RawMessage(c.Args)
	case c.Resource != "":
		uri, err := resourceURI(c.Server, c.Resource)
		if err != nil {
			return err
		}
		call.Method, call.URI = "resources/read", uri
	default:
		return errors.New("name one of --tool, --prompt, --resource or --url")
	}
	Explain(ctx, os.Stdout, m.Policy, call, c.Result)
	return nil
}

// resourceURI is a resource as the gateway judges a read of it: namespaced
// (under server unless it already is) and canonical, or refused.
func resourceURI(server, resource string) (string, error) {
	uri := resource
	if !strings.HasPrefix(strings.ToLower(uri), mcpuri.Prefix) {
		uri = mcpuri.Prefix + server + "/" + uri
	}
	return mcpuri.CanonicalNamespaced(uri)
}

// Explain prints what the engine decides for call.
func Explain(ctx context.Context, w io.Writer, e *policy.Engine, call *policy.Call, result string) {
	target := call.Name
	if target == "" {
		target = call.URI
	}
	fmt.Fprintf(w, "%s %s\n", call.Method, target)
	fmt.Fprintf(w, "  listed:   %v\n", e.Visible(ctx, call))
	v := e.CheckRequest(ctx, call)
	fmt.Fprintf(w, "  request:  %s by %s: %s\n", v.Decision, v.Rule, v.Reason)
	if result != "" && v.Decision != policy.Block {
		rv := e.CheckResponse(ctx, call, json.RawMessage(result))
		fmt.Fprintf(w, "  response: %s by %s", rv.Decision, rv.Rule)
		if rv.Reason != "" {
			fmt.Fprintf(w, ": %s", rv.Reason)
		}
		fmt.Fprintln(w)
	}
}

// URLTarget is where a URL connects: its host (a name, or an IP address)
// and its port.
type URLTarget struct {
	URL  string
	Host string
	Port uint16
}

// parseURLTarget reads an absolute URL; without a port, http and https (and
// ws, wss) have their default ones and other schemes need one.
func parseURLTarget(raw string) (URLTarget, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return URLTarget{}, fmt.Errorf("--url %q: %w", raw, err)
	}
	if u.Scheme == "" || u.Hostname() == "" {
		return URLTarget{}, fmt.Errorf("--url %q: want an absolute URL such as https://host/path", raw)
	}
	t := URLTarget{URL: u.Redacted(), Host: u.Hostname()}
	if p := u.Port(); p != "" {
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil || port == 0 {
			return URLTarget{}, fmt.Errorf("--url %q: port %q is not 1-65535", raw, p)
		}
		t.Port = uint16(port)
		return t, nil
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "ws":
		t.Port = 80
	case "https", "wss":
		t.Port = 443
	default:
		return URLTarget{}, fmt.Errorf("--url %q: %s has no default port here; give one (%s://host:port)", raw, u.Scheme, u.Scheme)
	}
	return t, nil
}

// ExplainURL prints what the [net] policy decides for a connection to t:
// the name (or, for an IP address, the address), the port, and what the
// VM's DNS does with the name.
func ExplainURL(w io.Writer, m *config.Merged, t URLTarget) {
	p := m.Net
	if p == nil {
		p = netpolicy.Default()
	}
	rankOf := map[string]policy.Rank{}
	for _, l := range m.Layers {
		rankOf[l.Path] = l.Rank
	}
	line := func(label string, v netpolicy.Verdict) {
		decision, from := "block", "(built-in)"
		if v.Allowed {
			decision = "allow"
		}
		if v.Source != "" {
			from = "(" + rankOf[v.Source].String() + ": " + v.Source + ")"
		}
		fmt.Fprintf(w, "  %-9s %s by %s %s", label+":", decision, v.Rule, from)
		if v.Reason != "" {
			fmt.Fprintf(w, ": %s", v.Reason)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "connect %s (host %s, port %d)\n", t.URL, t.Host, t.Port)
	port := p.Port(t.Port)
	allowed := port.Allowed
	if addr, err := netip.ParseAddr(t.Host); err == nil {
		v := p.Address(netip.AddrPortFrom(addr, t.Port))
		allowed = v.Allowed
		// Address checks the port first; to show the address's own
		// verdict when the port is refused, ask with a port that is not.
		if ports := p.Ports(); !port.Allowed && len(ports) > 0 {
			v = p.Address(netip.AddrPortFrom(addr, ports[0]))
		}
		if v.Rule == netpolicy.KeyPorts {
			fmt.Fprintf(w, "  %-9s not decided: no port is allowed\n", "address:")
		} else {
			line("address", v)
		}
	} else {
		v := p.Name(t.Host)
		line("name", v)
		allowed = allowed && v.Allowed
		if p.PrivateAllowed(t.Host) {
			fmt.Fprintf(w, "  %-9s %s may resolve to private or loopback addresses (net.allow_private)\n", "private:", t.Host)
		}
		if answer, ok := p.FixedHost(t.Host); ok {
			fmt.Fprintf(w, "  %-9s fixed answer %s (net.hosts)", "dns:", answer)
			if class := netpolicy.AddressClass(answer); class != "" && !p.PrivateAllowed(t.Host) {
				fmt.Fprintf(w, ", not handed out: a %s address, and %s is not in net.allow_private", class, t.Host)
			}
			fmt.Fprintln(w)
		}
	}
	line("port", port)
	decision := "block"
	if allowed {
		decision = "allow"
	}
	fmt.Fprintf(w, "  %-9s %s\n", "decision:", decision)
}

// ReloadCmd is `capsem policy reload`.
type ReloadCmd struct{}

// Run asks every running endpoint to reload and reports each answer; the
// exit status is 1 when any of them kept its previous policy, or when a
// VM the service runs did not answer.
func (ReloadCmd) Run(ctx context.Context) error {
	endpoints, err := paths.EndpointsDir()
	if err != nil {
		return err
	}
	// The records first: a VM that starts running after they are read
	// reads the new configuration itself, and is not expected to answer.
	reg, err := vmrecord.Open()
	if err != nil {
		return err
	}
	recs, errs := reg.Read()
	for _, err := range errs {
		fmt.Fprintf(os.Stderr, "capsem: %v\n", err)
	}
	results, err := reloadctl.ReloadAll(ctx, endpoints)
	if err != nil {
		return err
	}
	results = withVMs(results, recs, (*vmrecord.Record).ProcessAlive)
	if len(results) == 0 {
		fmt.Println("no running gateway or VM to reload")
		return nil
	}
	failed := 0
	for _, r := range results {
		if r.OK {
			fmt.Printf("reloaded %s %s (pid %d): %s\n", r.Kind, r.Name, r.PID, r.Detail)
			continue
		}
		failed++
		fmt.Printf("FAILED   %s %s (pid %d): %s\n", r.Kind, r.Name, r.PID, r.Error)
	}
	if failed > 0 {
		return exitcode.Error{Code: 1}
	}
	return nil
}

// withVMs names each answer from a VM's process after the service's record
// of the VM (its name and id), and adds a failure for each running VM
// (alive says whose process still runs) that did not answer: such a VM
// keeps the policy it had, and saying nothing would let the caller
// believe otherwise.
func withVMs(results []reloadctl.Result, recs []*vmrecord.Record, alive func(*vmrecord.Record) bool) []reloadctl.Result {
	byPID := map[int]int{}
	for i, r := range results {
		byPID[r.PID] = i
	}
	for _, rec := range recs {
		if rec.State != api.StateRunning || !alive(rec) {
			continue
		}
		label := rec.ID
		if rec.Name != "" {
			label = rec.Name + " (" + rec.ID + ")"
		}
		if i, ok := byPID[rec.PID]; ok {
			results[i].Kind, results[i].Name = "vm", label
			continue
		}
		results = append(results, reloadctl.Result{PID: rec.PID, Kind: "vm", Name: label,
			Error: "the VM runs, but its process did not answer on a policy-reload endpoint: it keeps the policy it had (capsem logs " + rec.ID + ")"})
	}
	slices.SortFunc(results, func(a, b reloadctl.Result) int { return a.PID - b.PID })
	return results
}
