package guestdoctor

import (
	"strings"
	"testing"
)

func TestParseMountinfo(t *testing.T) {
	in := `33 1 0:26 / / rw,relatime - overlay overlay rw,lowerdir=/run/capsem/lower,upperdir=/run/capsem/disk/upper,workdir=/run/capsem/disk/work
29 28 254:0 / /run/capsem/disk rw,relatime - ext4 /dev/vda rw,discard
34 33 0:29 / /root/my\040work rw,nosuid shared:1 master:2 - 9p workspace rw,trans=virtio
garbage line
36 33 0:26 /init /init ro,relatime - overlay
`
	ms := parseMountinfo([]byte(in))
	if len(ms) != 3 {
		t.Fatalf("%d entries: %+v", len(ms), ms)
	}
	root, ok := mountAt(ms, "/")
	if !ok || root.fstype != "overlay" || overlayOption(root.super, "upperdir") != "/run/capsem/disk/upper" {
		t.Fatalf("root %+v", root)
	}
	ws, ok := mountAt(ms, "/root/my work")
	if !ok || ws.fstype != "9p" || ws.source != "workspace" || ws.options != "rw,nosuid" {
		t.Fatalf("workspace %+v (octal escapes, optional fields)", ws)
	}
	if d, _ := mountAt(ms, "/run/capsem/disk"); d.major != 254 || d.minor != 0 || d.source != "/dev/vda" {
		t.Fatalf("disk %+v", d)
	}
}

func FuzzParseMountinfo(f *testing.F) {
	f.Add([]byte("33 1 0:26 / / rw - overlay overlay rw,upperdir=/u\n"))
	f.Add([]byte("1 2 3:4 /a\\040b /c\\134d rw x:1 - 9p tag rw\n- - - -\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range parseMountinfo(b) {
			// Every entry comes from one line that has the separator
			// and the fields after it.
			if m.fstype == "" || m.fstype == "-" && m.source == "" {
				t.Fatalf("entry without a filesystem type: %+v", m)
			}
			if strings.ContainsRune(m.target, '\n') {
				t.Fatalf("target spans lines: %q", m.target)
			}
		}
	})
}
