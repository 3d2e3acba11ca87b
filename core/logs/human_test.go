package logs

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
)

func TestHumanHandler(t *testing.T) {
	cases := []struct {
		name string
		log  func(*slog.Logger)
		want string
	}{
		{"info", func(l *slog.Logger) { l.Info("starting the VM", "stage", "boot") }, "capsem: starting the VM (stage boot)\n"},
		{"no attrs", func(l *slog.Logger) { l.Info("VM ready") }, "capsem: VM ready\n"},
		{"warning", func(l *slog.Logger) { l.Warn("slow disk", "mib_s", 12.5) }, "capsem: warning: slow disk (mib_s 12.5)\n"},
		{"error", func(l *slog.Logger) { l.Error("boot failed", "err", errors.New("no kernel")) }, "capsem: error: boot failed (err no kernel)\n"},
		{"quoted values", func(l *slog.Logger) { l.Info("m", "path", "/a b", "empty", "") }, `capsem: m (path "/a b", empty "")` + "\n"},
		{"control characters stay on the line", func(l *slog.Logger) { l.Info("a\nb\x1b[2J", "v", "x\ny") }, `capsem: a\nb\x1b[2J (v "x\ny")` + "\n"},
		{"groups and With", func(l *slog.Logger) {
			l.With("vm", "dev").WithGroup("net").With("port", 443).Info("m", "rule", "allow")
		}, "capsem: m (vm dev, net.port 443, net.rule allow)\n"},
		{"below the level", func(l *slog.Logger) { l.Debug("hidden") }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			tc.log(slog.New(NewHumanHandler(&b, slog.LevelInfo)))
			if b.String() != tc.want {
				t.Fatalf("got %q, want %q", b.String(), tc.want)
			}
		})
	}
}

func TestForStream(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A file is not a terminal: JSON lines unless text is asked for.
	ForStream(f, "info", FormatAuto).Info("one")
	ForStream(f, "info", FormatText).Info("two")
	ForStream(f, "info", FormatJSON).Info("three")
	b, _ := os.ReadFile(f.Name())
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], `{"time":`) || lines[1] != "capsem: two" || !strings.Contains(lines[2], `"msg":"three"`) {
		t.Fatalf("lines %q", lines)
	}
}
