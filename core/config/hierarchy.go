package config

import (
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/core/policy"
)

// Layer is one configuration source with its precedence.
type Layer struct {
	Path string
	Rank policy.Rank
	File *File
}

// Sources says where the configuration hierarchy is read from.
type Sources struct {
	// CorpPath is corp.toml; "" means none. A missing file is an error only
	// when CorpRequired (it was named explicitly).
	CorpPath     string
	CorpRequired bool
	// UserPath is user.toml (or the file given with --config); a missing
	// file is an error only when UserRequired.
	UserPath     string
	UserRequired bool
	// HomeDir is where AI CLI settings are auto-detected; "" turns
	// auto-detection off.
	HomeDir string
}

// DefaultSources resolves the standard locations: corp.toml from
// CAPSEM_CORP_CONFIG else /etc/capsem/corp.toml; user.toml in capsemHome
// unless configPath names another file; AI CLI settings in the user's home
// unless autodetect is false. CAPSEM_CORP_CONFIG set but empty is an error:
// it would silently drop the corp layer (name an empty file for none).
func DefaultSources(lookupEnv func(string) (string, bool), capsemHome, userHome, configPath string, autodetect bool) (Sources, error) {
	s := Sources{CorpPath: "/etc/capsem/corp.toml", UserPath: filepath.Join(capsemHome, "user.toml")}
	if v, ok := lookupEnv(envvars.CorpConfig.Name()); ok {
		if v == "" {
			return Sources{}, fmt.Errorf("%s is set but empty: name a corp.toml (an empty file for none), or unset it for /etc/capsem/corp.toml", envvars.CorpConfig.Name())
		}
		s.CorpPath, s.CorpRequired = v, true
	}
	if configPath != "" {
		s.UserPath, s.UserRequired = configPath, true
	}
	if autodetect {
		s.HomeDir = userHome
	}
	return s, nil
}

// Merged is the effective configuration of a hierarchy.
type Merged struct {
	// File holds the merged servers, builtin settings, timeouts and policy
	// lists; ServerDefs, SandboxPaths and ToolTimeouts work on it.
	File   *File
	Policy *policy.Engine
	// Net is the [net] policy of every file (File.Net stays empty).
	Net    *netpolicy.Policy
	Layers []Layer
	// ServerSources says which file defined each server.
	ServerSources map[string]string
	// Notes are things a reader of `capsem policy check` should know
	// (shadowed servers, skipped auto-detected entries).
	Notes []string
}

// DefaultsSource names capsem's own defaults (defaults.toml) where a file
// name would be.
const DefaultsSource = "(capsem defaults)"

//go:embed defaults.toml
var defaultsTOML []byte

// Defaults is capsem's own lowest layer: the [net] names the full root's
// AI CLIs and package managers need (defaults.toml).
func Defaults() *File {
	f, err := Parse(DefaultsSource, defaultsTOML)
	if err != nil {
		panic("config: the embedded defaults.toml does not parse: " + err.Error())
	}
	return f
}

// defaultsFor is Defaults with only the credentials whose key this
// process's environment holds (lookup): a default credential without its
// key would give every VM a placeholder for nothing and terminate the TLS
// of its model API for no reason. The service passes the keys its own
// environment holds on to the VMs' processes, so both see the same.
func defaultsFor(lookup func(string) (string, bool)) *File {
	f := Defaults()
	f.Net.Credentials = slices.DeleteFunc(f.Net.Credentials, func(c netpolicy.Credential) bool {
		v, ok := lookup(c.SourceEnv)
		return !ok || strings.TrimSpace(v) == ""
	})
	return f
}

// LoadHierarchy reads every source and merges them, above capsem's own
// defaults.
func LoadHierarchy(src Sources) (*Merged, error) {
	var layers []Layer
	var notes []string
	load := func(path string, required bool, rank policy.Rank) error {
		if path == "" {
			return nil
		}
		f, err := Load(path)
		if err != nil {
			if !required && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		layers = append(layers, Layer{Path: path, Rank: rank, File: f})
		return nil
	}
	if err := load(src.CorpPath, src.CorpRequired, policy.RankCorp); err != nil {
		return nil, err
	}
	if err := load(src.UserPath, src.UserRequired, policy.RankUser); err != nil {
		return nil, err
	}
	if src.HomeDir != "" {
		detected, detNotes := AutoDetect(src.HomeDir)
		notes = append(notes, detNotes...)
		for _, d := range detected {
			layers = append(layers, Layer{Path: d.Path, Rank: policy.RankAuto, File: &File{MCP: MCP{Servers: d.Servers}}})
		}
	}
	layers = append(layers, Layer{Path: DefaultsSource, Rank: policy.RankAuto, File: defaultsFor(os.LookupEnv)})
	m := Merge(layers)
	m.Notes = append(notes, m.Notes...)
	return m, nil
}

// Merge combines layers given highest precedence first. Servers: the first
// definition of a name wins, so corp's cannot be shadowed. Blocked servers:
// the union. Allowed servers: every non-empty whitelist applies (a lower file
// can only narrow it). Default: the highest file that sets one. Per-tool
// decisions: the stricter of two entries for a name, the higher file on a tie.
// Rules: all of them, each with its file's rank (a Block rule always wins; an
// Allow rule relaxes only decisions of its own rank or lower). [net]: every
// file's table, compiled by netpolicy.Compile (a lower file only tightens).
func Merge(layers []Layer) *Merged {
	layers = slices.Clone(layers)
	sort.SliceStable(layers, func(i, j int) bool { return layers[i].Rank > layers[j].Rank })
	m := &Merged{File: &File{}, Layers: layers, ServerSources: map[string]string{}}
	out := &m.File.MCP
	eng := &policy.Engine{
		Default:        policy.Entry{Decision: policy.Allow, Rank: policy.RankBuiltin},
		BlockedServers: map[string]string{},
		AllowedServers: map[string]string{},
		Tools:          map[string]policy.Entry{},
	}
	defaultSet := false
	var whitelist map[string]string
	toolTimeoutRank := map[string]policy.Rank{}
	for _, l := range layers {
		in := l.File.MCP
		for _, s := range in.Servers {
			if prev, ok := m.ServerSources[s.Name]; ok {
				m.Notes = append(m.Notes, fmt.Sprintf("server %q from %s is shadowed by the definition in %s", s.Name, l.Path, prev))
				continue
			}
			m.ServerSources[s.Name] = l.Path
			out.Servers = append(out.Servers, s)
		}
		if in.Default != "" && !defaultSet {
			d, _ := ParseDecision(in.Default)
			eng.Default = policy.Entry{Decision: d, Rank: l.Rank, Source: l.Path}
			out.Default, defaultSet = in.Default, true
		}
		for _, name := range in.BlockedServers {
			if _, ok := eng.BlockedServers[name]; !ok {
				eng.BlockedServers[name] = l.Path
				out.BlockedServers = append(out.BlockedServers, name)
			}
		}
		if len(in.AllowedServers) > 0 {
			next := map[string]string{}
			for _, name := range in.AllowedServers {
				src, ok := whitelist[name]
				if whitelist == nil {
					src, ok = l.Path, true
				}
				if ok {
					next[name] = src
				}
			}
			whitelist = next
		}
		for _, name := range slices.Sorted(maps.Keys(in.Tools)) {
			d, _ := ParseDecision(in.Tools[name])
			if prev, ok := eng.Tools[name]; ok && prev.Decision >= d {
				continue
			}
			eng.Tools[name] = policy.Entry{Decision: d, Rank: l.Rank, Source: l.Path}
		}
		for i, spec := range in.Rules {
			r, err := spec.Compile(fmt.Sprintf("%s.rules[%d]", l.Rank, i))
			if err != nil {
				continue // Parse refused it already; a File built in code may not have been parsed
			}
			r.Rank, r.Source = l.Rank, l.Path
			eng.Rules = append(eng.Rules, r)
			out.Rules = append(out.Rules, spec)
		}
		mergeBuiltin(&out.Builtin, l.File)
		mergeTimeouts(&out.Timeouts, l, toolTimeoutRank)
	}
	if whitelist != nil {
		eng.AllowedServers = whitelist
		out.AllowedServers = slices.Sorted(maps.Keys(whitelist))
		if len(whitelist) == 0 {
			// Whitelists with nothing in common allow no server at all.
			// "" is no server's name: nothing passes the whitelist.
			eng.AllowedServers = map[string]string{"": "(empty intersection of allowed_servers)"}
			out.AllowedServers = []string{""}
			m.Notes = append(m.Notes, "allowed_servers lists have no server in common: every server is blocked")
		}
	}
	out.Tools = map[string]string{}
	for name, e := range eng.Tools {
		out.Tools[name] = e.Decision.String()
	}
	m.Policy = eng
	m.Net = mergeNet(layers, &m.Notes)
	return m
}

// mergeNet compiles the layers' [net] tables, highest precedence first.
// Parse refuses every table that would not compile, so only a File built in
// code can fail here; the policy then refuses everything (dropping the bad
// file would drop its block list with it).
func mergeNet(layers []Layer, notes *[]string) *netpolicy.Policy {
	netLayers := make([]netpolicy.Layer, 0, len(layers))
	portsSet := false
	for _, l := range layers {
		nl := l.File.netLayer(l.Path)
		portsSet = portsSet || nl.PortsSet
		netLayers = append(netLayers, nl)
	}
	p, err := netpolicy.Compile(netLayers)
	if err != nil {
		*notes = append(*notes, "[net] does not compile, so the guest network refuses everything: "+err.Error())
		p, err = netpolicy.Compile([]netpolicy.Layer{{Source: "(invalid [net])", Default: "block", PortsSet: true, AllowPrivateSet: true}})
		if err != nil {
			panic("config: the refuse-everything [net] policy does not compile: " + err.Error())
		}
		return p
	}
	if portsSet && len(p.Ports()) == 0 {
		*notes = append(*notes, "net.ports lists have no port in common: the guest can reach no port")
	}
	return p
}

// mergeBuiltin takes each builtin setting from the highest file that sets
// it; blocked domains are the union of every file's.
func mergeBuiltin(out *Builtin, f *File) {
	in := f.MCP.Builtin
	set := func(key string) bool { return f.isDefined("mcp", "builtin", key) }
	if len(out.DomainAllow) == 0 && set("domain_allow") {
		out.DomainAllow = in.DomainAllow
	}
	for _, d := range in.DomainBlock {
		if !slices.Contains(out.DomainBlock, d) {
			out.DomainBlock = append(out.DomainBlock, d)
		}
	}
	if out.MaxBodyBytes == 0 && set("max_body_bytes") {
		out.MaxBodyBytes = in.MaxBodyBytes
	}
	if out.TimeoutSecs == 0 && set("timeout_secs") {
		out.TimeoutSecs = in.TimeoutSecs
	}
	if !out.privateSet && set("allow_private_networks") {
		out.AllowPrivateNetworks, out.privateSet = in.AllowPrivateNetworks, true
	}
}

func mergeTimeouts(out *Timeouts, l Layer, toolRank map[string]policy.Rank) {
	in := l.File.MCP.Timeouts
	if out.DefaultSecs == 0 && in.DefaultSecs > 0 {
		out.DefaultSecs = in.DefaultSecs
	}
	if out.ToolCallSecs == 0 && in.ToolCallSecs > 0 {
		out.ToolCallSecs = in.ToolCallSecs
	}
	for name, secs := range in.Tools {
		if _, ok := toolRank[name]; ok {
			continue
		}
		if out.Tools == nil {
			out.Tools = map[string]int{}
		}
		out.Tools[name], toolRank[name] = secs, l.Rank
	}
}
