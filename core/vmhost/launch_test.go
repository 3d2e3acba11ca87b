package vmhost

import (
	"strings"
	"testing"

	"github.com/capsem/capsem/core/api"
)

// TestReadReadiness: the stages before the ready line are told in order;
// a pipe that ends first, a line that is neither, or a line over the bound
// is an error that says so.
func TestReadReadiness(t *testing.T) {
	long := api.StagePrefix + strings.Repeat("x", api.MaxStageLine) + "\n"
	// A line of exactly the bound, its newline included, is taken.
	full := strings.Repeat("y", api.MaxStageLine-len(api.StagePrefix)-1)
	for _, tc := range []struct {
		name, pipe string
		stages     []string
		err        string
	}{
		{"ready at once", "ready\n", nil, ""},
		{"stages then ready", "stage checking the guest assets\nstage booting under tcg\nready\n", []string{"checking the guest assets", "booting under tcg"}, ""},
		{"ready then more", "ready\nstage late\n", nil, ""},
		{"nothing", "", nil, "ended before its API was ready"},
		{"stages, then the end", "stage booting\n", []string{"booting"}, "ended before its API was ready"},
		{"half a line", "rea", nil, "ended before its API was ready"},
		{"garbage", "hello\n", nil, `wrote "hello\n"`},
		{"too long", long, nil, "a line of over"},
		{"exactly the bound", api.StagePrefix + full + "\nready\n", []string{full}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			err := readReadiness(strings.NewReader(tc.pipe), func(s string) { got = append(got, s) })
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
			if strings.Join(got, "|") != strings.Join(tc.stages, "|") {
				t.Errorf("stages %q, want %q", got, tc.stages)
			}
		})
	}
}

// FuzzReadReadiness: whatever a process writes on its readiness pipe, the
// reader returns (ready, or an error), never panics, and tells only stages
// that fit in a line.
func FuzzReadReadiness(f *testing.F) {
	for _, s := range []string{"ready\n", "stage a\nready\n", "stage \n", "stage x", "\n", "\x00ready\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, pipe []byte) {
		in := string(pipe)
		var lines []string
		err := readReadiness(strings.NewReader(in), func(s string) { lines = append(lines, api.StagePrefix+s+"\n") })
		// What was told is the input's first lines, in order, and ready
		// is said only when the next line is the ready line.
		told := strings.Join(lines, "")
		if !strings.HasPrefix(in, told) {
			t.Fatalf("told %q, not the input's first lines %q", told, in)
		}
		if ready := strings.HasPrefix(in[len(told):], api.ReadyLine); (err == nil) != ready {
			t.Fatalf("err %v, yet the line after the stages is the ready line: %v (input %q)", err, ready, in)
		}
	})
}
