package logs

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

// TestProgressOnATerminal: the stages are one status line rewritten in
// place; a record goes above it, and Done takes it away.
func TestProgressOnATerminal(t *testing.T) {
	master, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 24, Cols: 40}); err != nil {
		t.Fatal(err)
	}
	log := ForStream(tty, "info", FormatAuto)
	var seen bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&seen, master); close(copied) }()
	p := NewProgress(log, "starting the VM")
	p.Stage("guest assets: building the kernel stage", slog.LevelInfo)
	log.Warn("something to say")
	p.Stage("booting", slog.LevelDebug)
	p.Done()
	time.Sleep(100 * time.Millisecond) // the terminal passes it all on
	tty.Close()
	<-copied
	got := seen.String()
	// A line past the terminal's width is cut, so it never wraps.
	for _, want := range []string{
		"capsem: starting the VM: guest assets:",
		"\r\x1b[Kcapsem: warning: something to say\r\n",
		"\r\x1b[Kcapsem: starting the VM: booting (0 s)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("terminal output lacks %q:\n%q", want, got)
		}
	}
	if strings.Contains(got, "kernel stage") {
		t.Errorf("the status line was not cut to the width:\n%q", got)
	}
	if !strings.HasSuffix(got, "\r\x1b[K") {
		t.Errorf("Done left the status line:\n%q", got)
	}
}

// TestProgressElsewhere: without a terminal each stage is a record.
func TestProgressElsewhere(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := NewProgress(log, "starting the VM")
	p.Stage("guest assets: cached", slog.LevelInfo)
	p.Stage("booting", slog.LevelDebug)
	p.Done()
	p.Done()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("records:\n%s", out.String())
	}
	var rec struct{ Level, Msg, Stage string }
	json.Unmarshal([]byte(lines[1]), &rec)
	if rec.Level != "DEBUG" || rec.Msg != "starting the VM" || rec.Stage != "booting" {
		t.Errorf("record %+v", rec)
	}
}
