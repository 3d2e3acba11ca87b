package modorder

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Entry
		err      string
	}{
		{"plain", "/lib/a.ko\n/lib/b.ko\n", []Entry{{Path: "/lib/a.ko"}, {Path: "/lib/b.ko"}}, ""},
		{"comments and blanks", "# x\n\n  /lib/a.ko  \n", []Entry{{Path: "/lib/a.ko"}}, ""},
		{"relative", "kernel/a.ko\n", []Entry{{Path: "/base/kernel/a.ko"}}, ""},
		{"params", "/a.ko debug=1 x=y\n", []Entry{{Path: "/a.ko", Params: []string{"debug=1", "x=y"}}}, ""},
		{"devices", "/vsock.ko | virtio:d00000013v*\n", []Entry{{Path: "/vsock.ko", Devices: []string{"virtio:d00000013v*"}}}, ""},
		{"params and devices", "/m.ko a=1 | pci:v1* acpi*:X:*\n", []Entry{{Path: "/m.ko", Params: []string{"a=1"}, Devices: []string{"pci:v1*", "acpi*:X:*"}}}, ""},
		{"bare param", "/a.ko debug\n", nil, `module parameter "debug" is not name=value`},
		{"bar without patterns", "/a.ko |\n", nil, `"|" with no device patterns`},
		{"two bars", "/a.ko | x | y\n", nil, `more than one "|"`},
		{"bar first", "| x\n", nil, `no module path`},
		{"long line", "/a.ko " + strings.Repeat("x=1 ", MaxLine), nil, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in), "/base")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v err %v, want %#v", got, err, tc.want)
			}
		})
	}
}

func TestChains(t *testing.T) {
	in := "---\n/a.ko\n/b.ko | virtio:d3*\n---\n---\n/c.ko\n---\n"
	chains, err := ParseChains([]byte(in), "/")
	want := [][]Entry{{{Path: "/a.ko"}, {Path: "/b.ko", Devices: []string{"virtio:d3*"}}}, {{Path: "/c.ko"}}}
	if err != nil || !reflect.DeepEqual(chains, want) {
		t.Fatalf("chains %#v err %v", chains, err)
	}
	flat, err := Parse([]byte(in), "/")
	if err != nil || len(flat) != 3 || flat[2].Path != "/c.ko" {
		t.Fatalf("flat %#v err %v", flat, err)
	}
	text, err := FormatChains(want)
	if err != nil || text != "/a.ko\n/b.ko | virtio:d3*\n---\n/c.ko\n" {
		t.Fatalf("format %q err %v", text, err)
	}
	if _, err := ParseChains([]byte("--- x\n"), "/"); err == nil || !strings.Contains(err.Error(), "stands alone") {
		t.Fatalf("separator with words: %v", err)
	}
	if _, err := Format([]Entry{{Path: "---"}}); err == nil {
		t.Fatal("a module path that reads back as a separator was written")
	}
}

func TestFormatRoundTripAndGolden(t *testing.T) {
	entries := []Entry{
		{Path: "/lib/modules/6.1.0-57-amd64/kernel/drivers/virtio/virtio_ring.ko"},
		{Path: "/lib/modules/6.1.0-57-amd64/kernel/drivers/virtio/virtio_pci.ko", Devices: []string{"pci:v00001AF4d*sv*sd*bc*sc*i*"}},
		{Path: "/lib/modules/6.1.0-57-amd64/kernel/drivers/virtio/virtio_mmio.ko", Devices: []string{"of:N*T*Cvirtio,mmioC*", "of:N*T*Cvirtio,mmio", "acpi*:LNRO0005:*"}},
		{Path: "/lib/modules/6.1.0-57-amd64/kernel/net/vmw_vsock/vsock.ko", Devices: []string{"virtio:d00000013v*"}},
		{Path: "/lib/modules/6.1.0-57-amd64/kernel/fs/ext4/ext4.ko"},
		{Path: "/m.ko", Params: []string{"a=1"}},
	}
	text, err := FormatChains([][]Entry{entries[:5], entries[5:]})
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "load-order.golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		os.WriteFile(golden, []byte(text), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if text != string(want) {
		t.Fatalf("format changed:\n%s\nwant:\n%s", text, want)
	}
	back, err := ParseChains([]byte(text), "/")
	if err != nil || !reflect.DeepEqual(back, [][]Entry{entries[:5], entries[5:]}) {
		t.Fatalf("round trip: %#v err %v", back, err)
	}
	for _, bad := range []Entry{{Path: "/" + strings.Repeat("x", MaxLine)}, {Path: "/a b.ko"}, {Path: "#x.ko"}, {Path: "|"}, {Path: "/a.ko", Devices: []string{""}}, {Path: "/a.ko", Params: []string{"x=a b"}}} {
		if _, err := Format([]Entry{bad}); err == nil {
			t.Errorf("Format(%#v) succeeded", bad)
		}
	}
}

func TestMatches(t *testing.T) {
	present := []string{"pci:v00001AF4d00001043sv00001AF4sd00001100bc07sc80i00", "virtio:d00000003v00001AF4", "acpi:PNP0A08:PNP0A03:"}
	for _, tc := range []struct {
		devices []string
		want    bool
	}{
		{[]string{"pci:v00001AF4d*sv*sd*bc*sc*i*"}, true},
		{[]string{"virtio:d00000003v*"}, true},
		{[]string{"virtio:d00000013v*"}, false},
		{[]string{"acpi*:LNRO0005:*"}, false},
		{[]string{"acpi*:PNP0A08:*"}, true},
		{[]string{"virtio:d00000013v*", "virtio:d00000003v*"}, true},
		{[]string{"[bad"}, true}, // malformed: load rather than miss
	} {
		if got := (Entry{Devices: tc.devices}).MatchesOn(func(string) []string { return present }); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.devices, got, tc.want)
		}
	}
}

func TestBus(t *testing.T) {
	for pattern, want := range map[string]string{
		"pci:v00001AF4d*": "pci", "virtio:d00000003v*": "virtio", "acpi*:LNRO0005:*": "acpi",
		"of:N*T*Cvirtio,mmio": "platform", "platform:x": "platform", "*:x": "", "p?i:x": "", "nocolon": "", "a/b:x": "", "..:x": "", ".:x": "",
	} {
		if got := Bus(pattern); got != want {
			t.Errorf("Bus(%q) = %q, want %q", pattern, got, want)
		}
	}
	// MatchesOn asks only the buses the patterns name.
	var asked []string
	e := Entry{Devices: []string{"virtio:d00000013v*", "pci:v00001AF4*"}}
	ok := e.MatchesOn(func(bus string) []string {
		asked = append(asked, bus)
		if bus == "pci" {
			return []string{"pci:v00001AF4d00001043"}
		}
		return nil
	})
	if !ok || !reflect.DeepEqual(asked, []string{"virtio", "pci"}) {
		t.Fatalf("matched %v, asked %v", ok, asked)
	}
}

func TestNameAndDeviceAliases(t *testing.T) {
	for in, want := range map[string]string{"/l/virtio-rng.ko": "virtio_rng", "/l/ext4.ko.xz": "ext4", "/l/9pnet_virtio.ko": "9pnet_virtio"} {
		if got := (Entry{Path: in}).Name(); got != want {
			t.Errorf("Name(%s) = %s, want %s", in, got, want)
		}
	}
	for alias, want := range map[string]bool{
		"pci:v00001AF4d*sv*sd*bc*sc*i*": true, "virtio:d00000013v*": true, "acpi*:LNRO0005:*": true,
		"of:N*T*Cvirtio,mmio": true, "fs-ext4": false, "crypto-crc32c": false, "9p-virtio": false,
		"devname:vhost-vsock": false, "cpu:type:x86,ven*fam*mod*:feature:*0094*": false,
	} {
		if got := IsDeviceAlias(alias); got != want {
			t.Errorf("IsDeviceAlias(%q) = %v, want %v", alias, got, want)
		}
	}
	got := CmdlineModules("console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 virtio-rng.x=1 quiet .x=1 y.=2 -- mod.z=1")
	if !reflect.DeepEqual(got, map[string]bool{"virtio_mmio": true, "virtio_rng": true}) {
		t.Fatalf("CmdlineModules: %v", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"/a.ko\n", "/a.ko x=1 | pci:v* virtio:d1*\n#c\n", "| x", "/a.ko |", "rel.ko a=b=c", "/a.ko\n---\n/b.ko\n", "---\n---"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		chains, err := ParseChains(data, "/base")
		if err != nil {
			return
		}
		for _, c := range chains {
			if len(c) == 0 {
				t.Fatal("an empty chain")
			}
			for _, e := range c {
				if !filepath.IsAbs(e.Path) {
					t.Fatalf("relative path %q", e.Path)
				}
				e.MatchesOn(func(string) []string { return []string{"pci:v1", "virtio:d3"} }) // must not panic
			}
		}
		// What parsed formats and parses back to the same chains.
		text, err := FormatChains(chains)
		if err != nil {
			return // e.g. a path Parse made absolute that starts oddly; Format refuses rather than lie
		}
		back, err := ParseChains([]byte(text), "/base")
		if err != nil || !reflect.DeepEqual(back, chains) {
			t.Fatalf("round trip of %q: %#v (err %v), want %#v", text, back, err, chains)
		}
	})
}
