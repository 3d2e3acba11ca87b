package process

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/api"
)

// readinessPipe runs report with the stage and ready functions of a Cmd
// writing on a fresh pipe, and returns what the pipe carried.
func readinessPipe(t *testing.T, stages bool, report func(stage func(string), ready func())) string {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	r := os.NewFile(uintptr(fds[0]), "ready-r")
	defer r.Close()
	stage, ready := (&Cmd{ReadyFD: fds[1], ReadyStages: stages}).readiness(slog.New(slog.DiscardHandler))
	if stage == nil {
		stage = func(string) {}
	}
	report(stage, ready) // ready closes the write end
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadinessWritesStagesAParentCanRead: stages are written only when
// asked for, one clean line each (control characters blanked, cut to the
// bound on a rune boundary), never more than a small pipe holds, and
// never after the ready line.
func TestReadinessWritesStagesAParentCanRead(t *testing.T) {
	long := strings.Repeat("é", api.MaxStageLine) // two bytes each
	got := readinessPipe(t, true, func(stage func(string), ready func()) {
		stage("checking\tthe\nassets\x1b[31m")
		stage(long)
		for range 200 { // far more than the budget
			stage(strings.Repeat("x", 100))
		}
		ready()
		stage("after ready")
	})
	lines := strings.SplitAfter(got, "\n")
	if lines[0] != api.StagePrefix+"checking the assets [31m\n" {
		t.Errorf("first line %q", lines[0])
	}
	if l := lines[1]; len(l) > api.MaxStageLine || !utf8.ValidString(l) || !strings.HasPrefix(l, api.StagePrefix+"éé") {
		t.Errorf("a long stage became %d bytes (valid UTF-8 %v)", len(l), utf8.ValidString(l))
	}
	if !strings.HasSuffix(got, "\n"+api.ReadyLine) || strings.Contains(got, "after ready") {
		t.Errorf("the pipe does not end with the ready line alone: ...%q", got[max(0, len(got)-120):])
	}
	if len(got) > 4096 {
		t.Errorf("%d bytes of stages and ready line: more than the smallest pipe holds", len(got))
	}
	if got := readinessPipe(t, false, func(stage func(string), ready func()) { stage("x"); ready() }); got != api.ReadyLine {
		t.Errorf("without --ready-stages the pipe carried %q, want the ready line alone", got)
	}
}
