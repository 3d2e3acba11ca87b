package mountinfo

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := `33 1 0:26 / / rw,relatime - overlay overlay rw,lowerdir=/run/capsem/lower,upperdir=/run/capsem/disk/upper,workdir=/run/capsem/disk/work
29 28 254:0 / /run/capsem/disk rw,relatime - ext4 /dev/vda rw,discard
34 33 0:29 / /root/my\040work rw,nosuid shared:1 master:2 - 9p workspace rw,trans=virtio
garbage line
36 33 0:26 /init /init ro,relatime - overlay
`
	ms := Parse([]byte(in))
	if len(ms) != 3 {
		t.Fatalf("%d entries: %+v", len(ms), ms)
	}
	root, ok := At(ms, "/")
	if !ok || root.FSType != "overlay" || Option(root.Super, "upperdir") != "/run/capsem/disk/upper" {
		t.Fatalf("root %+v", root)
	}
	ws, ok := At(ms, "/root/my work")
	if !ok || ws.FSType != "9p" || ws.Source != "workspace" || ws.Options != "rw,nosuid" {
		t.Fatalf("workspace %+v (octal escapes, optional fields)", ws)
	}
	if d, _ := At(ms, "/run/capsem/disk"); d.Major != 254 || d.Minor != 0 || d.Source != "/dev/vda" {
		t.Fatalf("disk %+v", d)
	}
	if _, ok := At(ms, "/nowhere"); ok {
		t.Fatal("found a mount that is not there")
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/mnt/a\040b\134c`: `/mnt/a b\c`, `/plain`: `/plain`, `/bad\09`: `/bad\09`, `\`: `\`, `/end\040`: `/end `} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSelf(t *testing.T) {
	ms, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := At(ms, "/proc"); !ok {
		t.Fatalf("/proc is not in this process's mount table: %+v", ms)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("33 1 0:26 / / rw - overlay overlay rw,upperdir=/u\n"))
	f.Add([]byte("1 2 3:4 /a\\040b /c\\134d rw x:1 - 9p tag rw\n- - - -\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		lines := strings.Count(string(b), "\n") + 1
		ms := Parse(b)
		if len(ms) > lines {
			t.Fatalf("%d entries from %d lines", len(ms), lines)
		}
		for _, m := range ms {
			if m.FSType == "" || strings.ContainsAny(m.Target+m.FSType+m.Options, "\n") {
				t.Fatalf("malformed entry accepted: %+v", m)
			}
		}
	})
}
