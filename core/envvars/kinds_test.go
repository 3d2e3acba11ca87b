package envvars

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// parseCase is one value of a variable: what it parses to, or the error
// that names it.
type parseCase struct {
	raw     string
	want    any
	wantErr string // "" when raw parses
}

// checkParse runs the cases through v.Parse and v.ValueFrom, and through
// the untyped Check capsem env uses.
func checkParse[T any](t *testing.T, v Var[T], cases []parseCase) {
	t.Helper()
	for _, c := range cases {
		got, err := v.Parse(c.raw)
		if c.wantErr != "" {
			if err == nil || err.Error() != c.wantErr {
				t.Errorf("%s.Parse(%q) error = %v, want %q", v.Name(), c.raw, err, c.wantErr)
			}
			if err := v.Check(c.raw); err == nil {
				t.Errorf("%s.Check(%q) accepted a value Parse refuses", v.Name(), c.raw)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s.Parse(%q): %v", v.Name(), c.raw, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s.Parse(%q) = %#v, want %#v", v.Name(), c.raw, got, c.want)
		}
		env := func(name string) string {
			if name == v.Name() {
				return c.raw
			}
			return ""
		}
		if got, ok, err := v.ValueFrom(env); err != nil || !ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s.ValueFrom(%q) = %#v, %v, %v; want %#v", v.Name(), c.raw, got, ok, err, c.want)
		}
		if err := v.Check(c.raw); err != nil {
			t.Errorf("%s.Check(%q): %v", v.Name(), c.raw, err)
		}
	}
}

func TestParseLevel(t *testing.T) {
	checkParse(t, LogLevel, []parseCase{
		{raw: "debug", want: "debug"},
		{raw: "error", want: "error"},
		{raw: "DEBUG", wantErr: `CAPSEM_LOG_LEVEL="DEBUG": want debug, info, warn or error`},
		{raw: "warning", wantErr: `CAPSEM_LOG_LEVEL="warning": want debug, info, warn or error`},
		{raw: " info", wantErr: `CAPSEM_LOG_LEVEL=" info": want debug, info, warn or error`},
	})
}

func TestParseAccelerator(t *testing.T) {
	checkParse(t, Accel, []parseCase{
		{raw: "kvm", want: "kvm"},
		{raw: "tcg", want: "tcg"},
		{raw: "hvf", wantErr: `CAPSEM_ACCEL="hvf": want kvm or tcg`},
		{raw: "TCG", wantErr: `CAPSEM_ACCEL="TCG": want kvm or tcg`},
	})
}

func TestParseOff(t *testing.T) {
	checkParse(t, BootState, []parseCase{
		{raw: "off", want: true},
		{raw: "on", wantErr: `CAPSEM_BOOT_STATE="on": want off (any other value leaves it on)`},
		{raw: "OFF", wantErr: `CAPSEM_BOOT_STATE="OFF": want off (any other value leaves it on)`},
	})
}

func TestParseFlagBool(t *testing.T) {
	const want = ": want true, 1, yes, false, 0 or no"
	checkParse(t, NoAutodetect, []parseCase{
		{raw: "1", want: true},
		{raw: "TRUE", want: true},
		{raw: "yes", want: true},
		{raw: "0", want: false},
		{raw: "No", want: false},
		{raw: "on", wantErr: `CAPSEM_NO_AUTODETECT="on"` + want},
		{raw: " 1", wantErr: `CAPSEM_NO_AUTODETECT=" 1"` + want},
	})
}

func TestParseSwitch10(t *testing.T) {
	checkParse(t, HTTPAllowPrivate, []parseCase{
		{raw: "1", want: true},
		{raw: " TRUE ", want: true},
		{raw: "false", want: false},
		{raw: "0", want: false},
		{raw: "yes", wantErr: `CAPSEM_HTTP_ALLOW_PRIVATE="yes": must be 1, true, 0 or false`},
		{raw: "2", wantErr: `CAPSEM_HTTP_ALLOW_PRIVATE="2": must be 1, true, 0 or false`},
	})
}

func TestParseMebibytes(t *testing.T) {
	checkParse(t, TCGCacheMiB, []parseCase{
		{raw: "64", want: 64},
		{raw: "0", want: 0},
		{raw: "0x40", want: 64}, // as kong reads an int
		{raw: "-1", want: -1},   // the service refuses it, naming the range
		{raw: "abc", wantErr: `CAPSEM_TCG_CACHE_MIB="abc": want a whole number of MiB`},
		{raw: "64M", wantErr: `CAPSEM_TCG_CACHE_MIB="64M": want a whole number of MiB`},
		{raw: "99999999999999999999", wantErr: `CAPSEM_TCG_CACHE_MIB="99999999999999999999": want a whole number of MiB`},
	})
}

func TestParseSeconds(t *testing.T) {
	const want = ": want a positive whole number of seconds (at most 9223372036)"
	checkParse(t, MCPDefaultTimeout, []parseCase{
		{raw: "60", want: time.Minute},
		{raw: "9223372036", want: 9223372036 * time.Second},
		{raw: "0", wantErr: `CAPSEM_MCP_DEFAULT_TIMEOUT_SECS="0"` + want},
		{raw: "-5", wantErr: `CAPSEM_MCP_DEFAULT_TIMEOUT_SECS="-5"` + want},
		{raw: "1.5", wantErr: `CAPSEM_MCP_DEFAULT_TIMEOUT_SECS="1.5"` + want},
		{raw: "30s", wantErr: `CAPSEM_MCP_DEFAULT_TIMEOUT_SECS="30s"` + want},
		{raw: "9223372037", wantErr: `CAPSEM_MCP_DEFAULT_TIMEOUT_SECS="9223372037"` + want}, // overflows a Duration
	})
}

func TestParseCount(t *testing.T) {
	checkParse(t, MCPInflight, []parseCase{
		{raw: "8", want: 8},
		{raw: "0", wantErr: `CAPSEM_MCP_INFLIGHT="0": want a positive integer`},
		{raw: "many", wantErr: `CAPSEM_MCP_INFLIGHT="many": want a positive integer`},
	})
}

func TestParseToolSeconds(t *testing.T) {
	checkParse(t, MCPToolTimeouts, []parseCase{
		{raw: "a__b=5", want: map[string]time.Duration{"a__b": 5 * time.Second}},
		{raw: "a__b=5, c__d=7", want: map[string]time.Duration{"a__b": 5 * time.Second, "c__d": 7 * time.Second}},
		{raw: "a__b=5,a__b=6", want: map[string]time.Duration{"a__b": 6 * time.Second}}, // the last wins
		{raw: "ab=5", wantErr: `CAPSEM_MCP_TOOL_TIMEOUTS="ab=5": item "ab=5": want server__tool=positive-seconds`},
		{raw: "a__b=0", wantErr: `CAPSEM_MCP_TOOL_TIMEOUTS="a__b=0": item "a__b=0": want server__tool=positive-seconds`},
		{raw: "a__b", wantErr: `CAPSEM_MCP_TOOL_TIMEOUTS="a__b": item "a__b": want server__tool=positive-seconds`},
		{raw: "a__b=5,", wantErr: `CAPSEM_MCP_TOOL_TIMEOUTS="a__b=5,": item "": want server__tool=positive-seconds`},
	})
}

func TestParseBodyBytes(t *testing.T) {
	checkParse(t, HTTPMaxBodyBytes, []parseCase{
		{raw: "1024", want: int64(1024)},
		{raw: " 1 ", want: int64(1)},
		{raw: "1073741824", want: int64(1 << 30)},
		{raw: "10MB", wantErr: `CAPSEM_HTTP_MAX_BODY_BYTES="10MB": not a whole number of bytes: strconv.ParseInt: parsing "10MB": invalid syntax`},
		{raw: "0", wantErr: `CAPSEM_HTTP_MAX_BODY_BYTES="0": must be between 1 and 1073741824 bytes`},
		{raw: "1073741825", wantErr: `CAPSEM_HTTP_MAX_BODY_BYTES="1073741825": must be between 1 and 1073741824 bytes`},
	})
}

func TestParseFractionalSeconds(t *testing.T) {
	const bounds = ": must be more than 0 and at most 3600 seconds"
	checkParse(t, HTTPTimeout, []parseCase{
		{raw: "2.5", want: 2500 * time.Millisecond},
		{raw: "3600", want: time.Hour},
		{raw: "30s", wantErr: `CAPSEM_HTTP_TIMEOUT_SECS="30s": not a number of seconds: strconv.ParseFloat: parsing "30s": invalid syntax`},
		{raw: "-1", wantErr: `CAPSEM_HTTP_TIMEOUT_SECS="-1"` + bounds},
		{raw: "NaN", wantErr: `CAPSEM_HTTP_TIMEOUT_SECS="NaN"` + bounds},
		{raw: "3601", wantErr: `CAPSEM_HTTP_TIMEOUT_SECS="3601"` + bounds},
		{raw: "1e-10", wantErr: `CAPSEM_HTTP_TIMEOUT_SECS="1e-10": timeout rounds down to zero`},
	})
}

func TestParseList(t *testing.T) {
	checkParse(t, DomainAllow, []parseCase{
		{raw: " *.github.com, pypi.org ,,", want: []string{"*.github.com", "pypi.org"}},
		{raw: "a", want: []string{"a"}},
	})
	// Blanks are no list at all: unset.
	if got, ok, err := DomainAllow.ValueFrom(func(string) string { return " , " }); err != nil || !ok || got != nil {
		t.Errorf("DomainAllow of \" , \" = %q, %v, %v; want no entries", got, ok, err)
	}
}

func TestParseUnixEndpoint(t *testing.T) {
	checkParse(t, MCPEndpoint, []parseCase{
		{raw: "unix:/tmp/gw.sock", want: "/tmp/gw.sock"},
		{raw: "unix:", wantErr: `CAPSEM_MCP_ENDPOINT="unix:": want unix:PATH`},
		{raw: "tcp:1.2.3.4:5", wantErr: `CAPSEM_MCP_ENDPOINT="tcp:1.2.3.4:5": want unix:PATH`},
		{raw: "/tmp/gw.sock", wantErr: `CAPSEM_MCP_ENDPOINT="/tmp/gw.sock": want unix:PATH`},
	})
}

func TestParsePID(t *testing.T) {
	checkParse(t, ParentPID, []parseCase{
		{raw: "1", want: 1},
		{raw: "0", wantErr: `CAPSEM_PARENT_PID="0": not a pid`},
		{raw: "x", wantErr: `CAPSEM_PARENT_PID="x": not a pid`},
	})
}

func TestParseTextAndPath(t *testing.T) {
	checkParse(t, Home, []parseCase{{raw: "~/odd path/\x01", want: "~/odd path/\x01"}})
	checkParse(t, TraceID, []parseCase{{raw: "trace=1,2", want: "trace=1,2"}})
}

// TestUnsetIsNoValue: unset and empty are the same, for every kind; kinds
// that ignore blanks take a blank value as unset too.
func TestUnsetIsNoValue(t *testing.T) {
	empty := func(string) string { return "" }
	if _, ok, err := MCPInflight.ValueFrom(empty); ok || err != nil {
		t.Errorf("MCPInflight unset: ok %v, err %v", ok, err)
	}
	if _, ok, err := HTTPMaxBodyBytes.ValueFrom(func(string) string { return "  " }); ok || err != nil {
		t.Errorf("HTTPMaxBodyBytes blank: ok %v, err %v", ok, err)
	}
	if _, ok, err := MCPInflight.ValueFrom(func(string) string { return " " }); ok || err == nil {
		t.Errorf("MCPInflight blank: ok %v, err %v; want an error (blanks are not ignored)", ok, err)
	}
	for _, s := range All() {
		if err := s.Check(""); err != nil {
			t.Errorf("%s.Check(\"\"): %v", s.Name(), err)
		}
	}
}

// TestValueReadsTheProcessEnvironment: Value and Get read the variable of
// their own name.
func TestValueReadsTheProcessEnvironment(t *testing.T) {
	t.Setenv("CAPSEM_MCP_INFLIGHT", "7")
	t.Setenv("CAPSEM_HOME", "/h")
	if n, ok, err := MCPInflight.Value(); n != 7 || !ok || err != nil {
		t.Errorf("MCPInflight.Value() = %d, %v, %v", n, ok, err)
	}
	if got := Home.Get(); got != "/h" {
		t.Errorf("Home.Get() = %q", got)
	}
	if v, ok := Home.Lookup(); v != "/h" || !ok {
		t.Errorf("Home.Lookup() = %q, %v", v, ok)
	}
	t.Setenv("CAPSEM_CORP_CONFIG", "")
	if v, ok := CorpConfig.Lookup(); v != "" || !ok {
		t.Errorf("CorpConfig.Lookup() of set-but-empty = %q, %v; want set", v, ok)
	}
	if got := Home.Pair("/x"); got != "CAPSEM_HOME=/x" {
		t.Errorf("Home.Pair = %q", got)
	}
}

// FuzzCheck: every variable's check takes any value without panicking, and
// a refusal names the variable and quotes the value, as people need it.
func FuzzCheck(f *testing.F) {
	for _, seed := range []string{"", " ", "0", "1", "-1", "0x10", "yes", "off", "debug", "kvm", "unix:/s", "a__b=1,c__d=2",
		"1e-10", "NaN", "Inf", "9223372037", "a,,b", "\x00", "é"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		for _, s := range All() {
			err := s.Check(value)
			if err == nil {
				continue
			}
			prefix := s.Name() + "=" + strconv.Quote(strings.TrimSpace(value)) + ": "
			if !strings.HasPrefix(err.Error(), prefix) && !strings.HasPrefix(err.Error(), s.Name()+"="+strconv.Quote(value)+": ") {
				t.Fatalf("%s.Check(%q) = %q: want it to start with %q", s.Name(), value, err, prefix)
			}
		}
	})
}

// FuzzToolSeconds: what parses is namespaced tools with positive
// deadlines, and writing it back out parses to the same.
func FuzzToolSeconds(f *testing.F) {
	for _, seed := range []string{"a__b=5", " a__b=5 , c__d=1", "a__b=0", "=5", "a__b=5,", "__=1", "a__b=+3", "a__b==3", "a__b=9223372037"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := MCPToolTimeouts.Parse(raw)
		if err != nil {
			return
		}
		var items []string
		for name, d := range got {
			if !strings.Contains(name, "__") || d <= 0 || d%time.Second != 0 {
				t.Fatalf("Parse(%q) gave %q=%v", raw, name, d)
			}
			if strings.ContainsAny(name, ",=") {
				continue // cannot be written back; the parse is still sound
			}
			items = append(items, name+"="+strconv.FormatInt(int64(d/time.Second), 10))
		}
		if len(items) < len(got) || len(items) == 0 {
			return
		}
		again, err := MCPToolTimeouts.Parse(strings.Join(items, ","))
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("Parse(%q) = %v; written back %q parses to %v, %v", raw, got, items, again, err)
		}
	})
}

// FuzzNumbers: whole numbers of every kind land in their kind's range.
func FuzzNumbers(f *testing.F) {
	for _, seed := range []string{"1", "0", "-1", "1073741824", "1073741825", "9223372036", "9223372037", "0x7fffffffffffffff", "1_0", "+5", " 5", "2.5", "1e-10", "3600.0000001"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if d, err := MCPDefaultTimeout.Parse(raw); err == nil && (d <= 0 || d%time.Second != 0) {
			t.Fatalf("seconds %q = %v", raw, d)
		}
		if n, err := MCPInflight.Parse(raw); err == nil && n <= 0 {
			t.Fatalf("count %q = %d", raw, n)
		}
		if n, err := HTTPMaxBodyBytes.Parse(raw); err == nil && (n <= 0 || n > maxHTTPBodyBytes) {
			t.Fatalf("bytes %q = %d", raw, n)
		}
		if d, err := HTTPTimeout.Parse(raw); err == nil && (d <= 0 || d > maxHTTPTimeout) {
			t.Fatalf("fractional seconds %q = %v", raw, d)
		}
		if n, err := ParentPID.Parse(raw); err == nil && n < 1 {
			t.Fatalf("pid %q = %d", raw, n)
		}
		if n, err := TCGCacheMiB.Parse(raw); err == nil {
			if m, err := strconv.ParseInt(raw, 0, 64); err != nil || int64(n) != m {
				t.Fatalf("MiB %q = %d; strconv says %d, %v", raw, n, m, err)
			}
		}
	})
}

// FuzzList: entries are never blank nor padded, and never hold a comma.
func FuzzList(f *testing.F) {
	for _, seed := range []string{"", "a", " a , b ,,", ",,,", "a,\tb"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := DomainBlock.Parse(raw)
		if err != nil {
			t.Fatalf("Parse(%q): %v; a list always parses", raw, err)
		}
		for _, e := range got {
			if e == "" || e != strings.TrimSpace(e) || strings.Contains(e, ",") {
				t.Fatalf("Parse(%q) has entry %q", raw, e)
			}
		}
	})
}
