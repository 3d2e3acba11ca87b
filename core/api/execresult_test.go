package api

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestResultOf(t *testing.T) {
	for _, tc := range []struct {
		name     string
		writes   []int // sizes written to stdout
		guestCut bool
		wantLen  int
		wantCut  bool
	}{
		{"small", []int{10}, false, 10, false},
		{"exactly the bound", []int{MaxExecOutput - 1, 1}, false, MaxExecOutput, false},
		{"over the bound", []int{MaxExecOutput - 1, 5, 7}, false, MaxExecOutput, true},
		{"cut in the guest", []int{3}, true, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr ExecOutput
			for _, n := range tc.writes {
				if w, err := stdout.Write([]byte(strings.Repeat("x", n))); w != n || err != nil {
					t.Fatalf("Write(%d) = %d, %v: a bounded stream still takes every byte", n, w, err)
				}
			}
			stderr.Write([]byte("e"))
			r := ResultOf(&ExecEvent{Done: true, ExitCode: 2, StdoutTruncated: tc.guestCut}, &stdout, &stderr, 1500*time.Millisecond)
			if len(r.Stdout) != tc.wantLen || r.StdoutTruncated != tc.wantCut || r.Stderr != "e" || r.StderrTruncated || r.ExitCode != 2 {
				t.Errorf("stdout %d bytes cut %v, stderr %q cut %v, exit %d", len(r.Stdout), r.StdoutTruncated, r.Stderr, r.StderrTruncated, r.ExitCode)
			}
			if r.DurationMS != 1500 {
				t.Errorf("duration %d ms, want the caller's 1500 when the guest gave none", r.DurationMS)
			}
		})
	}
	if r := ResultOf(&ExecEvent{DurationMS: 42}, &ExecOutput{}, &ExecOutput{}, time.Second); r.DurationMS != 42 {
		t.Errorf("duration %d ms, want the guest's 42", r.DurationMS)
	}
}

func TestStageLogLevel(t *testing.T) {
	for stage, want := range map[string]slog.Level{
		StageAssets + "downloading linux-image-amd64":   slog.LevelInfo,
		"checking the guest assets":                     slog.LevelDebug,
		"resuming the saved boot of this configuration": slog.LevelDebug,
	} {
		if got := StageLogLevel(stage); got != want {
			t.Errorf("%q: %v, want %v", stage, got, want)
		}
	}
}
