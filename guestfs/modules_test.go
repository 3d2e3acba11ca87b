package guestfs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

func TestLoadOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		deps    map[string][]string
		wanted  []string
		want    []string
		wantErr string
	}{
		{
			name:   "chain",
			deps:   map[string][]string{"virtio_console": {"virtio", "virtio_ring"}, "virtio": nil, "virtio_ring": nil},
			wanted: []string{"virtio_console"},
			want:   []string{"virtio", "virtio_ring", "virtio_console"},
		},
		{
			name: "diamond loads shared deps once",
			deps: map[string][]string{
				"9p": {"9pnet", "fscache", "netfs"}, "fscache": {"netfs"}, "9pnet": nil, "netfs": nil,
				"9pnet_virtio": {"virtio", "9pnet", "virtio_ring"}, "virtio": nil, "virtio_ring": nil,
			},
			wanted: []string{"9pnet_virtio", "9p"},
			want:   []string{"virtio", "9pnet", "virtio_ring", "9pnet_virtio", "netfs", "fscache", "9p"},
		},
		{
			name:   "wanted order kept when independent",
			deps:   map[string][]string{"overlay": nil, "ext4": {"jbd2"}, "jbd2": nil},
			wanted: []string{"overlay", "ext4"},
			want:   []string{"overlay", "jbd2", "ext4"},
		},
		{
			name:   "wanted dependency listed first is not repeated",
			deps:   map[string][]string{"ext4": {"jbd2", "mbcache"}, "jbd2": nil, "mbcache": nil},
			wanted: []string{"jbd2", "ext4", "jbd2"},
			want:   []string{"jbd2", "mbcache", "ext4"},
		},
		{
			name:    "cycle",
			deps:    map[string][]string{"a": {"b"}, "b": {"c"}, "c": {"a"}},
			wanted:  []string{"a"},
			wantErr: "cycle: a -> b -> c -> a",
		},
		{
			name:    "self cycle",
			deps:    map[string][]string{"a": {"a"}},
			wanted:  []string{"a"},
			wantErr: "cycle: a -> a",
		},
		{
			name:    "unknown dependency",
			deps:    map[string][]string{"a": {"missing"}},
			wanted:  []string{"a"},
			wantErr: "no module missing",
		},
		{name: "nothing wanted", deps: map[string][]string{}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadOrder(tc.wanted, func(n string) ([]string, error) {
				d, ok := tc.deps[n]
				if !ok {
					return nil, fmt.Errorf("no module %s", n)
				}
				return d, nil
			})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("order %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseModulesDep(t *testing.T) {
	text := `kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/net/9p/9pnet.ko:
kernel/arch/x86/crypto/crc32c-intel.ko.xz:

kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/mbcache.ko.xz kernel/fs/jbd2/jbd2.ko.xz
`
	deps, err := parseModulesDep(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"9p":           {"9pnet", "fscache", "netfs"},
		"9pnet":        {},
		"crc32c_intel": {},
		"ext4":         {"crc16", "mbcache", "jbd2"},
	}
	if len(deps) != len(want) {
		t.Fatalf("parsed %v, want %v", deps, want)
	}
	for k, v := range want {
		if !slices.Equal(deps[k], v) {
			t.Fatalf("%s: %v, want %v", k, deps[k], v)
		}
	}
	for _, bad := range []string{"kernel/a.ko kernel/b.ko\n", "kernel/a.txt: kernel/b.ko\n", "kernel/a.ko: b.txt\n"} {
		if _, err := parseModulesDep(strings.NewReader(bad)); err == nil {
			t.Fatalf("parseModulesDep(%q) accepted malformed input", bad)
		}
	}
}

func TestParseModinfo(t *testing.T) {
	mi := parseModinfo([]byte("license=GPL\x00softdep=pre: crypto-crc32c post: foo\x00depends=jbd2,mbcache,crc16\x00alias=fs-ext4\x00alias=ext3\x00name=ext4\x00"))
	if !slices.Equal(mi.Depends, []string{"jbd2", "mbcache", "crc16"}) {
		t.Fatalf("depends %v", mi.Depends)
	}
	if !slices.Equal(mi.SoftPre, []string{"crypto-crc32c"}) {
		t.Fatalf("softdep pre %v", mi.SoftPre)
	}
	if !slices.Equal(mi.Aliases, []string{"fs-ext4", "ext3"}) {
		t.Fatalf("aliases %v", mi.Aliases)
	}
	if mi := parseModinfo([]byte("depends=\x00")); len(mi.Depends) != 0 {
		t.Fatalf("empty depends parsed as %v", mi.Depends)
	}
}

// writeModTree lays out a fake lib/modules/<release> like Debian's package:
// no modules.dep, modules.builtin listing built-ins, some modules xz-compressed.
func writeModTree(t *testing.T, withDepFile bool) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "lib", "modules", "6.1.0-99-amd64")
	writeModTreeAt(t, root, withDepFile)
	return root
}

// writeModTreeAt writes the fake modules of writeModTree under root.
func writeModTreeAt(t testing.TB, root string, withDepFile bool) {
	t.Helper()
	put := func(rel string, data []byte) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mod := func(rel string, info ...string) { put(rel, fakeModule(t, info...)) }
	mod("kernel/drivers/virtio/virtio.ko", "depends=", "name=virtio")
	mod("kernel/drivers/virtio/virtio_ring.ko", "depends=", "name=virtio_ring")
	mod("kernel/drivers/char/virtio_console.ko", "alias=virtio:d00000003v*", "alias=devname:vport", "depends=virtio,virtio_ring", "name=virtio_console")
	mod("kernel/net/vmw_vsock/vsock.ko", "depends=", "name=vsock")
	mod("kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko", "alias=virtio:d00000013v*", "depends=virtio,virtio_ring,vsock", "name=vmw_vsock_virtio_transport")
	// ext4 is compressed and soft-depends on an alias two modules provide;
	// jbd2 depends on a built-in.
	put("kernel/fs/ext4/ext4.ko.xz", xzCompress(t, fakeModule(t, "softdep=pre: crypto-crc32c", "depends=jbd2,crc16", "name=ext4"), xz.CRC32))
	mod("kernel/fs/jbd2/jbd2.ko", "softdep=pre: crypto-crc32c", "depends=mbcache_builtin", "name=jbd2")
	mod("kernel/lib/crc16.ko", "depends=", "name=crc16")
	mod("kernel/arch/x86/crypto/crc32c-intel.ko", "alias=crypto-crc32c", "alias=crc32c", "depends=", "name=crc32c_intel")
	mod("kernel/crypto/crc32c_generic.ko", "alias=crypto-crc32c", "alias=crc32c", "depends=", "name=crc32c_generic")
	mod("kernel/fs/overlayfs/overlay.ko", "softdep=pre: not-there", "depends=", "name=overlay")
	mod("kernel/net/broken.ko", "depends=nowhere", "name=broken")
	// A non-crypto alias, found only by indexing the whole tree.
	mod("kernel/fs/squash/squash.ko", "softdep=pre: fs-helper", "depends=", "name=squash")
	mod("kernel/lib/helper.ko", "alias=fs-help*", "depends=", "name=helper")
	put("modules.builtin", []byte("kernel/fs/mbcache_builtin.ko\nkernel/drivers/virtio/virtio_pci.ko\n"))
	put("modules.order", []byte("kernel/drivers/virtio/virtio.ko\n"))
	if withDepFile {
		// modules.dep wins over .modinfo for hard dependencies.
		put("modules.dep", []byte("kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n"))
	}
}

func TestModTreeSelect(t *testing.T) {
	root := writeModTree(t, false)
	mt, err := openModTree(root, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	order, builtin, absent, err := mt.selectModules([]string{"virtio_pci", "virtio_console", "ext4", "overlay", "no_such_module"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(builtin, []string{"virtio_pci"}) || !slices.Equal(absent, []string{"no_such_module"}) {
		t.Fatalf("built in %v, absent %v", builtin, absent)
	}
	want := []string{"virtio", "virtio_ring", "virtio_console", "crc32c_generic", "jbd2", "crc16", "ext4", "overlay"}
	if !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	// Compressed modules come out plain, at the .ko path.
	data, err := mt.readModule("ext4")
	if err != nil {
		t.Fatal(err)
	}
	if string(data[:4]) != "\x7fELF" {
		t.Fatal("ext4 was not decompressed")
	}
	if got := plainModulePath(mt.paths["ext4"]); got != "kernel/fs/ext4/ext4.ko" {
		t.Fatalf("guest path %s", got)
	}
	if order, _, _, err := mt.selectModules([]string{"squash"}); err != nil || !slices.Equal(order, []string{"helper", "squash"}) {
		t.Fatalf("alias softdep: order %v, err %v", order, err)
	}
	if _, _, _, err := mt.selectModules([]string{"broken"}); err == nil || !strings.Contains(err.Error(), "neither a module nor built in") {
		t.Fatalf("missing hard dependency: error %v", err)
	}
}

func TestModTreeUsesModulesDep(t *testing.T) {
	mt, err := openModTree(writeModTree(t, true), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	order, _, _, err := mt.selectModules([]string{"virtio_console"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"virtio_ring", "virtio", "virtio_console"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v (modules.dep order)", order, want)
	}
}

func TestModuleChains(t *testing.T) {
	mt, err := openModTree(writeModTree(t, false), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	order, _, _, err := mt.selectModules([]string{"virtio_console", "ext4", "overlay", "vmw_vsock_virtio_transport"})
	if err != nil {
		t.Fatal(err)
	}
	weight := map[string]int64{"ext4": 2000, "jbd2": 300, "virtio_console": 100, "overlay": 150}
	chains, err := mt.chains(order, func(n string) int64 { return weight[n] })
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"crc32c_generic", "jbd2", "crc16", "ext4"}, // heaviest first
		{"overlay"},
		{"virtio", "virtio_ring", "virtio_console", "vsock", "vmw_vsock_virtio_transport"},
	}
	if !reflect.DeepEqual(chains, want) {
		t.Fatalf("chains %v, want %v (order %v)", chains, want, order)
	}
	// Each chain keeps the load order, and together they are all of it.
	var flat []string
	for _, c := range chains {
		flat = append(flat, c...)
	}
	slices.Sort(flat)
	sorted := slices.Clone(order)
	slices.Sort(sorted)
	if !slices.Equal(flat, sorted) {
		t.Fatalf("chains cover %v, order is %v", flat, order)
	}
}

func TestDeviceConditions(t *testing.T) {
	mt, err := openModTree(writeModTree(t, false), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	wanted := []string{"virtio_console", "vmw_vsock_virtio_transport", "ext4"}
	order, _, _, err := mt.selectModules(wanted)
	if err != nil {
		t.Fatal(err)
	}
	conds, err := mt.deviceConditions(wanted, order)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		// Drivers load for their device only; virtio_console's own
		// "devname:" alias is not a device condition.
		"virtio_console":             {"virtio:d00000003v*"},
		"vmw_vsock_virtio_transport": {"virtio:d00000013v*"},
		// vsock serves only the vsock driver, so it shares its condition;
		// virtio and virtio_ring serve both drivers: either device will do.
		"vsock":       {"virtio:d00000013v*"},
		"virtio":      {"virtio:d00000003v*", "virtio:d00000013v*"},
		"virtio_ring": {"virtio:d00000003v*", "virtio:d00000013v*"},
		// ext4 and what it needs: always.
	}
	for m := range conds {
		slices.Sort(conds[m])
	}
	if !reflect.DeepEqual(conds, want) {
		t.Fatalf("conditions %v, want %v", conds, want)
	}
	// A module wanted for itself always loads, even if a driver needs it
	// too; virtio_ring, needed only by the driver, keeps the condition.
	wanted = []string{"virtio_console", "virtio"}
	order, _, _, _ = mt.selectModules(wanted)
	conds, err = mt.deviceConditions(wanted, order)
	if err != nil || !reflect.DeepEqual(conds, map[string][]string{"virtio_console": {"virtio:d00000003v*"}, "virtio_ring": {"virtio:d00000003v*"}}) {
		t.Fatalf("conditions %v, err %v", conds, err)
	}
}

// signedModule appends a sign-file style signature of sigLen bytes with the
// given 8-byte header to body.
func signedModule(body []byte, header []byte, sigLen uint32) []byte {
	out := append(slices.Clone(body), bytes.Repeat([]byte{0x30}, int(sigLen))...)
	out = append(out, header...)
	out = binary.BigEndian.AppendUint32(out, sigLen)
	return append(out, moduleSigMarker...)
}

func TestStripModuleSignature(t *testing.T) {
	body := append([]byte("\x7fELF"), bytes.Repeat([]byte{7}, 100)...)
	pkcs7 := []byte{0, 0, 2, 0, 0, 0, 0, 0}
	for _, tc := range []struct {
		name    string
		in      []byte
		want    []byte
		wantErr string
	}{
		{"unsigned", body, body, ""},
		{"signed", signedModule(body, pkcs7, 500), body, ""},
		{"signed, signature of one byte", signedModule(body, pkcs7, 1), body, ""},
		{"marker alone", moduleSigMarker, nil, "too short"},
		{"X.509 id type", signedModule(body, []byte{0, 0, 1, 0, 0, 0, 0, 0}, 500), nil, "not a plain PKCS#7"},
		{"signer name set", signedModule(body, []byte{0, 0, 2, 4, 0, 0, 0, 0}, 500), nil, "not a plain PKCS#7"},
		{"padding set", signedModule(body, []byte{0, 0, 2, 0, 0, 0, 0, 1}, 500), nil, "not a plain PKCS#7"},
		{"empty signature", signedModule(body, pkcs7, 0), nil, "does not fit"},
		{"length beyond the data", func() []byte {
			m := signedModule(body, pkcs7, 10)
			binary.BigEndian.PutUint32(m[len(m)-len(moduleSigMarker)-4:], 1<<20)
			return m
		}(), nil, "does not fit"},
		{"not ELF", signedModule([]byte("#!/bin/sh\n"), pkcs7, 10), nil, "not an ELF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := stripModuleSignature(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "appended signature") {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("got %d bytes, want %d", len(got), len(tc.want))
			}
		})
	}
}
