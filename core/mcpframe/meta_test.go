package mcpframe

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestMetaLineGolden pins the metadata line's bytes (testdata/mcpframe/
// meta_line.txt, quoted; -update rewrites it) and reads it back.
func TestMetaLineGolden(t *testing.T) {
	lines := []Meta{{Name: "claude"}, {Name: "claude", TraceID: "run-7:a.b_c"}, {Name: "bad name\x01", TraceID: "has space"}}
	var got strings.Builder
	for _, m := range lines {
		got.WriteString(strings.TrimSpace(quote(AppendMetaLine(nil, m))) + "\n")
	}
	path := filepath.Join("..", "..", "testdata", "mcpframe", "meta_line.txt")
	if *update {
		if err := os.WriteFile(path, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden missing (run with -update): %v", err)
	}
	if got.String() != string(want) {
		t.Fatalf("metadata lines changed:\n%s\nwant:\n%s", got.String(), want)
	}
	for _, tc := range []struct {
		line string
		want Meta
		err  string
	}{
		{MetaPrefix + "claude\n", Meta{Name: "claude"}, ""},
		{MetaPrefix + "claude", Meta{Name: "claude"}, ""},
		{MetaPrefix + "claude\ttrace=t-1\n", Meta{Name: "claude", TraceID: "t-1"}, ""},
		{MetaPrefix + "claude\tcolour=blue\ttrace=t-1\n", Meta{Name: "claude", TraceID: "t-1"}, ""}, // a newer relay's field is skipped
		{MetaPrefix + "\n", Meta{Name: "unknown"}, ""},
		{MetaPrefix + "claude\ttrace=\n", Meta{}, "trace id of 0 bytes"},
		{MetaPrefix + "claude\ttrace=a b\n", Meta{}, `trace id "a b"`},
		{MetaPrefix + "claude\ttrace=" + strings.Repeat("x", MaxTraceID+1) + "\n", Meta{}, "trace id of 129 bytes"},
		{"CAPSEM_META:claude\n", Meta{}, "does not start with"},
		{MetaPrefix + strings.Repeat("n", MaxMetaLine) + "\n", Meta{}, "more than 4096"},
	} {
		got, err := ParseMetaLine([]byte(tc.line))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %+v, %v; want an error containing %q", tc.line, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
}

func quote(b []byte) string {
	return strings.NewReplacer("\x00", `\0`, "\t", `\t`, "\n", `\n`).Replace(string(b))
}

// FuzzParseMetaLine: any line the guest sends yields a safe name and trace
// id or an error, and what AppendMetaLine writes reads back the same.
func FuzzParseMetaLine(f *testing.F) {
	for _, s := range []string{MetaPrefix + "claude\n", MetaPrefix + "x\ttrace=t-1\tz=9\n", MetaPrefix + "\xff\x00\n", "nope"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := ParseMetaLine(line)
		if err != nil {
			return
		}
		if m.Name == "" || len(m.Name) > MaxNameLen || !utf8.ValidString(m.Name) || strings.ContainsAny(m.Name, " \t\n\x00") {
			t.Fatalf("unsafe name %q", m.Name)
		}
		if m.TraceID != "" && CheckTraceID(m.TraceID) != nil {
			t.Fatalf("unsafe trace id %q", m.TraceID)
		}
		back, err := ParseMetaLine(AppendMetaLine(nil, m))
		if err != nil || back != m {
			t.Fatalf("%+v wrote and read back as %+v, %v", m, back, err)
		}
	})
}
