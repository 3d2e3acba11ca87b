package doctor

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func sampleGroups(calls *[]string) []Group {
	note := func(name string, f func(r *Reporter)) Check {
		return Check{Name: name, Run: func(_ context.Context, r *Reporter) { *calls = append(*calls, name); f(r) }}
	}
	return []Group{
		{Name: "a", Checks: []Check{
			note("fine", func(r *Reporter) { r.Okf("all %s", "good") }),
			note("meh", func(r *Reporter) { r.Warnf("do this", "not great") }),
		}},
		{Name: "b", Hint: "the group's fix", Checks: []Check{
			note("broken", func(r *Reporter) { r.Failf("fix that", "bad\nvery bad") }),
			note("no-hint", func(r *Reporter) { r.Failf("", "no hint of its own") }),
			note("silent", func(r *Reporter) {}),
			note("panics", func(r *Reporter) { panic("boom") }),
			note("after", func(r *Reporter) { r.Okf("still ran") }),
		}},
	}
}

func TestRunText(t *testing.T) {
	var calls []string
	var out bytes.Buffer
	sum := Run(context.Background(), NewReporter(&out, false), sampleGroups(&calls))
	if sum.Result != "FAIL" || sum.OK != 2 || sum.Warn != 1 || sum.Fail != 4 {
		t.Fatalf("summary %+v", sum)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		"ok    a         fine                all good",
		"warn  a         meh                 not great  (fix: do this)",
		"fail  b         broken              bad very bad  (fix: fix that)",
		"fail  b         no-hint             no hint of its own  (fix: the group's fix)",
		"fail  b         silent              the check reported nothing  (fix: this is a bug in the check)",
		"fail  b         panics              the check panicked: boom  (fix: this is a bug in the check)",
		"ok    b         after               still ran",
		"RESULT: FAIL (2 ok, 1 warn, 4 fail)",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
	if len(calls) != 7 {
		t.Fatalf("ran %v", calls)
	}
}

// A guest's doctor results are relayed by the host's: what a hostile guest
// puts in them is shown, never sent to the terminal.
func TestGuestResultsCannotDriveTheTerminal(t *testing.T) {
	hostile := Result{Group: "vm\x1b]0;title\x07", Name: "net\u009b2J", Status: Fail,
		Detail: "\x1b]52;c;ZXZpbA==\x07 gone", Hint: "run \x1b[8m hidden"}
	for _, asJSON := range []bool{false, true} {
		var out bytes.Buffer
		NewReporter(&out, asJSON).Add(hostile)
		if i := strings.IndexFunc(out.String(), func(r rune) bool { return r < 0x20 && r != '\n' || r >= 0x7f && r <= 0x9f }); i >= 0 {
			t.Errorf("json %v: a control character reached the output at %d: %q", asJSON, i, out.String())
		}
	}
	want := `fail  vm\x1b]0;title\x07  net\u009b2J         \x1b]52;c;ZXZpbA==\x07 gone  (fix: run \x1b[8m hidden)`
	if got := FormatLine(hostile); got != want {
		t.Errorf("FormatLine = %q, want %q", got, want)
	}
}

func TestRunJSONRoundTrips(t *testing.T) {
	var calls []string
	var out bytes.Buffer
	Run(context.Background(), NewReporter(&out, true), sampleGroups(&calls))
	var rs []Result
	var sum *Summary
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		r, s, ok := ParseLine([]byte(line))
		if !ok {
			t.Fatalf("unparsable line %q", line)
		}
		if r != nil {
			rs = append(rs, *r)
		} else {
			sum = s
		}
	}
	if len(rs) != 7 || sum == nil || sum.Result != "FAIL" || sum.Fail != 4 {
		t.Fatalf("%d results, summary %+v", len(rs), sum)
	}
	if rs[2] != (Result{Group: "b", Name: "broken", Status: Fail, Detail: "bad\nvery bad", Hint: "fix that"}) {
		t.Fatalf("result %+v", rs[2])
	}
}

func TestSelect(t *testing.T) {
	var calls []string
	all := sampleGroups(&calls)
	for _, c := range []struct {
		want    []string
		got     string
		wantErr string
	}{
		{nil, "a,b", ""},
		{[]string{"b"}, "b", ""},
		{[]string{"b", "a"}, "a,b", ""}, // the groups' own order
		{[]string{"c"}, "", `unknown check group "c" (groups: a, b)`},
	} {
		gs, err := Select(all, c.want)
		if c.wantErr != "" {
			if err == nil || err.Error() != c.wantErr {
				t.Errorf("Select(%v): %v, want %q", c.want, err, c.wantErr)
			}
			continue
		}
		var names []string
		for _, g := range gs {
			names = append(names, g.Name)
		}
		if err != nil || strings.Join(names, ",") != c.got {
			t.Errorf("Select(%v) = %v, %v; want %s", c.want, names, err, c.got)
		}
	}
}

func TestParseLineRefuses(t *testing.T) {
	for _, line := range []string{
		``, `not json`, `{}`, `{"group":"a","name":"b","status":"great"}`, `{"group":"","name":"b","status":"ok"}`,
		`{"result":"MAYBE"}`, `[1,2]`, `{"group":"a","name":"b","status":"ok"`,
	} {
		if r, s, ok := ParseLine([]byte(line)); ok {
			t.Errorf("ParseLine(%q) = %+v %+v, want refused", line, r, s)
		}
	}
}

func FuzzParseLine(f *testing.F) {
	f.Add([]byte(`{"group":"fs","name":"workspace","status":"fail","detail":"x","hint":"y"}`))
	f.Add([]byte(`{"result":"PASS","ok":3,"warn":0,"fail":0}`))
	f.Add([]byte(`{"result":"PASS","group":"a"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, s, ok := ParseLine(line)
		if !ok {
			if r != nil || s != nil {
				t.Fatal("refused, yet returned a value")
			}
			return
		}
		if (r == nil) == (s == nil) {
			t.Fatalf("exactly one of result and summary: %+v %+v", r, s)
		}
		if r != nil {
			if r.Group == "" || r.Name == "" || (r.Status != OK && r.Status != Warn && r.Status != Fail) {
				t.Fatalf("accepted an invalid result %+v", r)
			}
			// What a reporter prints of it parses back the same.
			var out bytes.Buffer
			NewReporter(&out, true).Add(*r)
			again, _, ok := ParseLine(bytes.TrimSpace(out.Bytes()))
			if !ok || *again != *r {
				t.Fatalf("%+v printed as %q parsed as %+v", r, out.String(), again)
			}
		}
		if s != nil && s.Result != "PASS" && s.Result != "FAIL" {
			t.Fatalf("accepted summary %+v", s)
		}
	})
}
