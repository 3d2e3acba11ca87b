package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLoadRefusesWhatIsNotAConfigFile: a FIFO (which used to hang the
// reader), a device such as /dev/zero (read until memory ran out), a
// directory and an oversized file are refused at once, naming the file and
// why; so is the same as a user.toml or an AI CLI settings file.
func TestLoadRefusesWhatIsNotAConfigFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "user.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", MaxFileBytes)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		fifo:        "is not a regular file (a FIFO)",
		"/dev/zero": "is not a regular file (a character device)",
		dir:         "is not a regular file (a directory)",
		big:         "bytes; the limit is 1048576",
	} {
		done := make(chan error, 1)
		go func() { _, err := Load(path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), want) {
				t.Errorf("Load(%s): %v; want an error naming it and %q", path, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Load(%s) still reading after 10 s", path)
		}
	}
	// The same refusal for a FIFO where an AI CLI's settings belong: a
	// note, not a hang.
	home := filepath.Join(dir, "home")
	os.MkdirAll(home, 0o700)
	if err := syscall.Mkfifo(filepath.Join(home, ".claude.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan []string, 1)
	go func() { _, notes := AutoDetect(home); done <- notes }()
	select {
	case notes := <-done:
		if len(notes) != 1 || !strings.Contains(notes[0], "not a regular file") {
			t.Errorf("notes %q", notes)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("auto-detection hangs on a FIFO")
	}
}

// TestParseRefusesDeepNesting: 48 KB of nested inline tables took the
// decoder 18-50 s and gigabytes; it is refused before decoding, with the
// line, and the unknown keys an error lists are bounded.
func TestParseRefusesDeepNesting(t *testing.T) {
	deep := "[mcp]\nx = " + strings.Repeat("{a=", 12000) + "1" + strings.Repeat("}", 12000) + "\n"
	_, err := Parse("deep.toml", []byte(deep))
	if !errors.Is(err, errNesting) || !strings.Contains(err.Error(), "deep.toml: line 2") {
		t.Fatalf("deep inline tables: %v", err)
	}
	arrays := "[mcp]\nblocked_servers = " + strings.Repeat("[", MaxNesting+1) + strings.Repeat("]", MaxNesting+1) + "\n"
	if _, err := Parse("arrays.toml", []byte(arrays)); !errors.Is(err, errNesting) {
		t.Fatalf("deep arrays: %v", err)
	}
	// Brackets in strings and comments are text, not nesting.
	text := "# " + strings.Repeat("[", 100) + "\n[mcp]\ndefault = \"allow\"\n" +
		"[[mcp.rules]]\naction = \"block\"\nargument = \"x\"\nname = \"" + strings.Repeat("[{", 100) + "\"\n" +
		"[[mcp.rules]]\naction = \"block\"\nargument = \"y\"\nname = '''" + strings.Repeat("{", 100) + "''' # ]]]\n"
	if _, err := Parse("text.toml", []byte(text)); err != nil {
		t.Fatalf("brackets in strings and comments: %v", err)
	}
	// Many unknown keys are named up to a bound.
	var many strings.Builder
	many.WriteString("[mcp]\n")
	for i := range 500 {
		many.WriteString("k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "_" + strings.Repeat("y", i/26) + " = 1\n")
	}
	_, err = Parse("many.toml", []byte(many.String()))
	if err == nil || !strings.Contains(err.Error(), "and 490 more") || len(err.Error()) > 1000 {
		t.Fatalf("unknown keys: %.300v (%d bytes)", err, len(err.Error()))
	}
}

func TestCheckNesting(t *testing.T) {
	for in, ok := range map[string]bool{
		`a = [[1], [2, [3]]]`:                                  true,
		`a = "]]]]" # [[[[`:                                    true,
		`a = "\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["`:              true,
		"a = \"\"\"\n[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"\"\"": true,
		"a = '''x'''''":                                        true,
		`a = ` + strings.Repeat("[", MaxNesting) + strings.Repeat("]", MaxNesting): true,
		`a = ` + strings.Repeat("[", MaxNesting+1):                                 false,
		`a = ` + strings.Repeat("{b=", MaxNesting+1):                               false,
	} {
		if err := checkNesting([]byte(in), MaxNesting); (err == nil) != ok {
			t.Errorf("checkNesting(%.60q) = %v, want ok %v", in, err, ok)
		}
	}
}

func FuzzCheckNesting(f *testing.F) {
	f.Add([]byte(`a = [[1], {b = "]"}] # [`))
	f.Add([]byte("a = '''\n[[[''' \"\\\"\""))
	f.Fuzz(func(t *testing.T, data []byte) {
		err := checkNesting(data, 4)
		// Whatever it says, a text it accepts has no run of more than
		// four opening brackets in a row outside strings and comments
		// that a plain count would miss: check the weaker, exact fact
		// that an accepted text without quotes or comments has depth at
		// most four.
		if err != nil || strings.ContainsAny(string(data), "\"'#") {
			return
		}
		depth, most := 0, 0
		for _, c := range data {
			switch c {
			case '[', '{':
				depth++
				most = max(most, depth)
			case ']', '}':
				depth = max(depth-1, 0)
			}
		}
		if most > 4 {
			t.Fatalf("accepted depth %d: %q", most, data)
		}
	})
}

// TestServerEnvChecked: a server's env goes through the sandbox's name
// checks (LD_* and the like would run code before the server does), in a
// config file as an error naming the server and the variable, and in AI
// CLI settings as a skipped entry.
func TestServerEnvChecked(t *testing.T) {
	for _, env := range []string{`LD_PRELOAD = "/tmp/x.so"`, `BASH_ENV = "/tmp/rc"`, `"BASH_FUNC_x%%" = "() { id; }"`, `CAPSEM_SANDBOX = "1"`} {
		_, err := Parse("user.toml", []byte("[[mcp.servers]]\nname = \"s\"\ncommand = \"/bin/true\"\nenv = { "+env+" }\n"))
		name, _, _ := strings.Cut(env, " ")
		if err == nil || !strings.Contains(err.Error(), "env") || !strings.Contains(err.Error(), strings.Trim(name, `"`)) {
			t.Errorf("env %s: %v", env, err)
		}
	}
	if _, err := Parse("user.toml", []byte("[[mcp.servers]]\nname = \"s\"\ncommand = \"/bin/true\"\nenv = { GITHUB_TOKEN = \"x\" }\n")); err != nil {
		t.Errorf("an ordinary variable: %v", err)
	}
	servers, notes := parseMCPServers("settings.json", []byte(`{"mcpServers":{"evil":{"command":"x","env":{"LD_PRELOAD":"/tmp/x.so"}},"ok":{"command":"y"}}}`), map[string]string{})
	if len(servers) != 1 || servers[0].Name != "ok" || len(notes) != 1 || !strings.Contains(notes[0], `"evil" skipped: env`) {
		t.Errorf("servers %+v, notes %q", servers, notes)
	}
}
