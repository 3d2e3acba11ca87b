// Package modorder is the guest image's module list, /lib/modules/load-order:
// the image builder writes it and the guest agent (PID 1) reads it at boot.
//
// One module per line, dependencies first:
//
//	PATH [PARAM=VALUE ...] [| DEVICE-ALIAS-PATTERN ...]
//
// A line "---" ends a chain: no module of one chain needs a module of
// another, so chains may load at the same time, each in its own order.
//
// Without patterns the module always loads. With patterns (after a lone
// "|") it loads only when a device present at that point of the boot has a
// modalias matching one of them, as udev's coldplug would decide: a driver
// for hardware the VM does not have (vsock on a serial-channel VM, the
// virtio-mmio transport on a PCI machine) costs nothing. Empty lines and
// lines starting with "#" are ignored.
package modorder

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// Path is where the initramfs keeps the list.
const Path = "/lib/modules/load-order"

// MaxLine bounds one line; a longer one is an error, not a truncation.
const MaxLine = 4096

// Entry is one module to load.
type Entry struct {
	Path    string   // absolute path of the .ko (or compressed .ko.xz …)
	Params  []string // module parameters, "name=value"
	Devices []string // modalias patterns; empty: always load
}

// Name is the module's name as the kernel knows it (dashes become
// underscores): /lib/…/virtio-rng.ko is virtio_rng.
func (e Entry) Name() string {
	base := filepath.Base(e.Path)
	for _, ext := range []string{".xz", ".gz", ".zst"} {
		base = strings.TrimSuffix(base, ext)
	}
	return strings.ReplaceAll(strings.TrimSuffix(base, ".ko"), "-", "_")
}

// Conditional reports whether the entry depends on a device being present.
func (e Entry) Conditional() bool { return len(e.Devices) > 0 }

// MatchesOn reports whether one of the entry's patterns matches the
// modalias of a present device. devices is asked bus by bus (see Bus), so a
// caller reads only the buses the patterns name, stopping at the first
// match. A malformed pattern counts as a match: loading a module too many
// is harmless, missing one is not.
func (e Entry) MatchesOn(devices func(bus string) []string) bool {
	for _, p := range e.Devices {
		for _, a := range devices(Bus(p)) {
			if ok, err := path.Match(p, a); ok || err != nil {
				return true
			}
		}
	}
	return false
}

// Bus is the /sys/bus directory whose devices a modalias pattern can
// match ("pci:v1AF4*" → "pci", "acpi*:LNRO0005:*" → "acpi", device-tree
// "of:…" → "platform"), or "" when the pattern names no bus, meaning all.
func Bus(pattern string) string {
	prefix, _, ok := strings.Cut(pattern, ":")
	if !ok || strings.ContainsAny(prefix, "?[\\/") {
		return ""
	}
	prefix = strings.TrimSuffix(prefix, "*")
	if prefix == "" || prefix == "." || prefix == ".." || strings.Contains(prefix, "*") {
		return ""
	}
	if prefix == "of" {
		return "platform"
	}
	return prefix
}

// ChainSeparator is the line between two chains.
const ChainSeparator = "---"

// Parse reads a load-order file as one list, chains one after the other.
// Relative paths are resolved against base (the list's directory).
func Parse(data []byte, base string) ([]Entry, error) {
	chains, err := ParseChains(data, base)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, c := range chains {
		out = append(out, c...)
	}
	return out, nil
}

// ParseChains reads a load-order file as its chains (empty ones dropped).
func ParseChains(data []byte, base string) ([][]Entry, error) {
	var chains [][]Entry
	var out []Entry
	for n, line := range strings.Split(string(data), "\n") {
		if len(line) > MaxLine {
			return nil, fmt.Errorf("load-order line %d: %d bytes, longer than %d", n+1, len(line), MaxLine)
		}
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if fields[0] == ChainSeparator {
			if len(fields) > 1 {
				return nil, fmt.Errorf("load-order line %d: %q stands alone on its line", n+1, ChainSeparator)
			}
			if len(out) > 0 {
				chains = append(chains, out)
			}
			out = nil
			continue
		}
		e := Entry{Path: fields[0]}
		if e.Path == "|" {
			return nil, fmt.Errorf("load-order line %d: no module path before \"|\"", n+1)
		}
		if !filepath.IsAbs(e.Path) {
			e.Path = filepath.Join(base, e.Path)
		}
		rest := fields[1:]
		for i, f := range rest {
			if f == "|" {
				e.Devices = rest[i+1:]
				if len(e.Devices) == 0 {
					return nil, fmt.Errorf("load-order line %d: \"|\" with no device patterns after it", n+1)
				}
				for _, d := range e.Devices {
					if d == "|" {
						return nil, fmt.Errorf("load-order line %d: more than one \"|\"", n+1)
					}
				}
				break
			}
			if !strings.Contains(f, "=") {
				return nil, fmt.Errorf("load-order line %d: module parameter %q is not name=value", n+1, f)
			}
			e.Params = append(e.Params, f)
		}
		out = append(out, e)
	}
	if len(out) > 0 {
		chains = append(chains, out)
	}
	return chains, nil
}

// Format writes entries in the file's syntax. Paths, parameters and
// patterns must not contain white space (module paths and modaliases never
// do); Format refuses them rather than write a list that reads back wrong.
func Format(entries []Entry) (string, error) { return FormatChains([][]Entry{entries}) }

// FormatChains writes chains separated by ChainSeparator lines.
func FormatChains(chains [][]Entry) (string, error) {
	var b strings.Builder
	for i, entries := range chains {
		if i > 0 {
			b.WriteString(ChainSeparator + "\n")
		}
		if err := formatEntries(&b, entries); err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

func formatEntries(b *strings.Builder, entries []Entry) error {
	for _, e := range entries {
		words := append([]string{e.Path}, e.Params...)
		if len(e.Devices) > 0 {
			words = append(append(words, "|"), e.Devices...)
		}
		for _, w := range words {
			if w == "" || strings.ContainsAny(w, " \t\r\n") {
				return fmt.Errorf("load-order: %q (module %s) is empty or contains white space", w, e.Path)
			}
		}
		if strings.HasPrefix(e.Path, "#") || e.Path == "|" || e.Path == ChainSeparator {
			return fmt.Errorf("load-order: module path %q would not read back", e.Path)
		}
		line := strings.Join(words, " ")
		if len(line) > MaxLine {
			return fmt.Errorf("load-order: the line for module %s is %d bytes, longer than %d", e.Path, len(line), MaxLine)
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return nil
}

// IsDeviceAlias reports whether a module alias names hardware a bus
// enumerates (so its presence can be checked in /sys/bus/*/devices), as
// opposed to aliases for request_module ("fs-ext4", "crypto-crc32c") or
// for CPU features, which are not conditions here.
func IsDeviceAlias(alias string) bool {
	bus, _, ok := strings.Cut(alias, ":")
	if !ok {
		return false
	}
	switch strings.TrimSuffix(bus, "*") {
	case "pci", "virtio", "acpi", "of", "platform", "usb":
		return true
	}
	return false
}

// CmdlineModules names the modules the kernel command line passes
// parameters to ("virtio_mmio.device=…" names virtio_mmio): a module
// configured there is wanted whatever devices are present, since those
// parameters may be what creates its devices.
func CmdlineModules(cmdline string) map[string]bool {
	out := map[string]bool{}
	for _, f := range strings.Fields(cmdline) {
		if f == "--" {
			break // the rest is init's arguments
		}
		key, _, _ := strings.Cut(f, "=")
		mod, param, ok := strings.Cut(key, ".")
		if ok && mod != "" && param != "" {
			out[strings.ReplaceAll(mod, "-", "_")] = true
		}
	}
	return out
}
