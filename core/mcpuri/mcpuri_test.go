package mcpuri

import (
	"errors"
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	const static = "demo://resource/static/document/1"
	for in, want := range map[string]string{
		static:                                            static,
		"DEMO://resource/static/document/1":               static,
		"demo://RESOURCE/static/document/1":               static,
		"Demo://Resource/static/document/1":               static,
		"demo://resource/x/../static/document/1":          static,
		"demo://resource/./static/document/1":             static,
		"demo://resource/static/./document/../document/1": static,
		"demo://resource/%73tatic/document/1":             static, // %73 is 's'
		"demo://resource/x/%2E%2E/static/document/1":      static, // encoded dots are dots
		"demo://resource/a/b/../../static/document/1":     static,
		"demo://resource/../../static/document/1":         static, // above the root stays at the root
		"demo://resource/static/document/1?q=%7e#Frag":    static + "?q=~#Frag",
		"demo://resource/static/%2fx":                     "demo://resource/static/%2Fx", // reserved: kept encoded, upper hex
		"demo://User@HOST:8080/p":                         "demo://User@host:8080/p",
		"file:///etc/./passwd":                            "file:///etc/passwd",
		"urn:isbn:0451450523":                             "urn:isbn:0451450523",
		"DATA:text/plain,a/../b":                          "data:text/plain,a/../b", // not a hierarchical path
		"relative/../path":                                "relative/../path",
		"demo://resource/dir/.":                           "demo://resource/dir/",
		"demo://résource/ünï":                             "demo://résource/ünï",
		"/0/..//a":                                        "/.//a", // not an authority
		"x:/b/..//host/p":                                 "x:/.//host/p",
		"demo://h/a/..//b":                                "demo://h//b",
	} {
		got, err := Canonical(in)
		if err != nil || got != want {
			t.Errorf("Canonical(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestCanonicalRefuses(t *testing.T) {
	for _, in := range []string{
		" demo://resource/static/1", "demo://resource/static/1 ", "demo://resource/sta\ttic/1", "demo://resource/static/1\n",
		"demo://resource/%09static", "demo://resource/%20x", "demo://resource/%0a", "demo://resource/\x00", "demo://resource/\x7f",
		"demo://resource/\u00a0x", "demo://resource/\u2028", "demo://resource/\u200b", "demo://resource/\ufeff",
		"demo://resource/%zz", "demo://resource/%4", "demo://resource/%", "demo://resource/\xff\xfe", "demo://resource/\u0085",
	} {
		if got, err := Canonical(in); !errors.Is(err, ErrRefused) {
			t.Errorf("Canonical(%q) = %q, %v; want a refusal", in, got, err)
		}
	}
}

func TestCanonicalNamespaced(t *testing.T) {
	got, err := CanonicalNamespaced("capsem://everything/DEMO://resource/x/../static/1")
	if err != nil || got != "capsem://everything/demo://resource/static/1" {
		t.Fatalf("%q %v", got, err)
	}
	if got, err := CanonicalNamespaced("CAPSEM://everything/demo://r/1"); err != nil || got != "capsem://everything/demo://r/1" {
		t.Fatalf("outer scheme case: %q %v", got, err)
	}
	for _, in := range []string{"demo://x", "capsem://", "capsem://srv", "capsem://srv/", "capsem:///x", "capsem://s rv/x", "capsem://srv/ x"} {
		if got, err := CanonicalNamespaced(in); !errors.Is(err, ErrRefused) {
			t.Errorf("CanonicalNamespaced(%q) = %q, %v; want a refusal", in, got, err)
		}
	}
}

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{"demo://resource/x/../static/1", "A://B/%2e%2E/./c?%7E#x", "file:///a/./../b", "urn:x", "%41", "//h/p"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Canonical(s)
		if err != nil {
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("an error that is not a refusal: %v", err)
			}
			return
		}
		again, err := Canonical(c)
		if err != nil || again != c {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", s, c, again, err)
		}
		if strings.ContainsAny(c, " \t\r\n\x00") {
			t.Fatalf("canonical form %q holds white space", c)
		}
	})
}

// BenchmarkCanonicalNamespaced is what canonicalisation adds to a resource
// read, beside the namespace split the endpoint did before (the baseline).
func BenchmarkCanonicalNamespaced(b *testing.B) {
	const uri = "capsem://everything/demo://resource/static/document/architecture.md"
	b.Run("baseline-split", func(b *testing.B) {
		for range b.N {
			rest, _ := strings.CutPrefix(uri, Prefix)
			if s, _, ok := strings.Cut(rest, "/"); !ok || s == "" {
				b.Fatal("split")
			}
		}
	})
	for name, u := range map[string]string{"canonical-already": uri, "dot-segments-and-case": "capsem://everything/DEMO://Resource/x/../static/./document/%61rchitecture.md"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := CanonicalNamespaced(u); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
