package guestdoctor_test

import (
	"bufio"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/testkit"
)

// results parses the doctor's JSON lines, failing on any other line.
func results(t *testing.T, out string) ([]doctor.Result, *doctor.Summary) {
	t.Helper()
	var rs []doctor.Result
	var sum *doctor.Summary
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		r, s, ok := doctor.ParseLine(sc.Bytes())
		switch {
		case !ok:
			t.Fatalf("not a doctor line: %q", sc.Text())
		case r != nil:
			rs = append(rs, *r)
		default:
			sum = s
		}
	}
	if sum == nil {
		t.Fatalf("no summary line in:\n%s", out)
	}
	return rs, sum
}

// TestGuestDoctorPassesInARealVM is the one-shot health check:
// every group passes on a VM as capsem makes it, and the text and JSON
// forms say the same.
func TestGuestDoctorPassesInARealVM(t *testing.T) {
	stdout, stderr, code := testkit.CapsemRun(t, "--env", "DOCTOR_PROBE=injected", "--", "sh", "-c",
		"capsem-doctor --expect-env DOCTOR_PROBE=injected; echo ==; capsem-doctor --json --expect-env DOCTOR_PROBE=injected")
	text, jsonOut, _ := strings.Cut(stdout, "==\n")
	if code != 0 || !strings.HasSuffix(strings.TrimSpace(text), "RESULT: PASS (28 ok, 0 warn, 0 fail)") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rs, sum := results(t, jsonOut)
	groups := map[string]int{}
	for _, r := range rs {
		groups[r.Group]++
		if r.Status != doctor.OK {
			t.Errorf("%s/%s: %s %s", r.Group, r.Name, r.Status, r.Detail)
		}
		if !strings.Contains(text, doctor.FormatLine(r)[:30]) {
			t.Errorf("the text output lacks %q", doctor.FormatLine(r))
		}
	}
	for _, g := range []string{"env", "fs", "exec", "mcp", "agents", "net", "sandbox"} {
		if groups[g] == 0 {
			t.Errorf("group %s reported nothing", g)
		}
	}
	if sum.Result != "PASS" || sum.OK != len(rs) {
		t.Errorf("summary %+v for %d results", sum, len(rs))
	}
}

// TestGuestDoctorFindsFaults: each fault made on purpose in a real VM
// fails its check, with the reason, and the doctor exits 1.
func TestGuestDoctorFindsFaults(t *testing.T) {
	// The minimal base, whose capsem binary is /init itself.
	stdout, stderr, code := testkit.CapsemRun(t, "--base", "minimal", "--", "sh", "-c",
		"umount /root/workspace && umount /init && export LD_DOCTOR=1 && hostname impostor && "+
			"capsem-doctor --json --expect-env ABSENT=1")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	rs, sum := results(t, stdout)
	failed := map[string]doctor.Result{}
	for _, r := range rs {
		if r.Status == doctor.Fail {
			failed[r.Group+"/"+r.Name] = r
		}
	}
	for check, want := range map[string]string{
		"fs/workspace":               "is not mounted",
		"sandbox/binaries-read-only": "is writable",
		"env/refused-env":            "LD_DOCTOR",
		"env/hostname":               `"impostor"`,
		"env/injected-env":           "ABSENT",
	} {
		r, ok := failed[check]
		if !ok || !strings.Contains(r.Detail, want) || r.Hint == "" {
			t.Errorf("%s: %+v, want a failure naming %q with a hint", check, r, want)
		}
	}
	if sum.Result != "FAIL" || sum.Fail != len(failed) || len(failed) != 5 {
		t.Errorf("summary %+v, failures %v", sum, failed)
	}
}
