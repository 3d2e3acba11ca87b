package guestwire

import (
	"strings"
	"testing"
)

func TestCmdlineValue(t *testing.T) {
	line := "console=ttyS0 capsem.upper=first quiet capsem.upper=capsem-upper capsem.workspace=workspace capsem.upperx=no"
	cases := []struct {
		key, want string
		ok        bool
	}{
		{CmdlineUpperDisk, "capsem-upper", true}, // the last one wins
		{CmdlineWorkspace, "workspace", true},
		{"capsem.channel", "", false},
		{"capsem", "", false},
	}
	for _, c := range cases {
		if v, ok := CmdlineValue(line, c.key); v != c.want || ok != c.ok {
			t.Errorf("%s: got %q %v, want %q %v", c.key, v, ok, c.want, c.ok)
		}
	}
	if v, ok := CmdlineValue("capsem.workspace=", CmdlineWorkspace); v != "" || !ok {
		t.Errorf("empty value: %q %v", v, ok)
	}
}

// TestStorageTimingIsOptional: a Hello without storage_ms (an agent that
// predates it, or a VM without storage) decodes, and one with it keeps it.
func TestStorageTimingIsOptional(t *testing.T) {
	for _, want := range []BootTimings{{ChannelMS: 3}, {ModulesMS: 1, StorageMS: 42, ChannelMS: 3}} {
		b, err := (&Hello{ProtocolVersion: ProtocolVersion, Boot: want}).MarshalMsg(nil)
		if err != nil {
			t.Fatal(err)
		}
		var got Hello
		if _, err := got.UnmarshalMsg(b); err != nil || got.Boot != want {
			t.Fatalf("round trip of %+v: %+v %v", want, got.Boot, err)
		}
	}
}

// FuzzCmdlineValue: a value never spans parameters (no whitespace), and
// appending key=v to any command line makes v the answer.
func FuzzCmdlineValue(f *testing.F) {
	f.Add("console=ttyS0 capsem.upper=a quiet", "capsem.upper", "b")
	f.Add("capsem.upper=", "capsem.upper", "")
	f.Add("\tcapsem.workspace=x\n", "capsem.workspace", "y")
	f.Fuzz(func(t *testing.T, cmdline, key, value string) {
		v, ok := CmdlineValue(cmdline, key)
		if strings.ContainsAny(v, " \t\n\r\v\f") {
			t.Fatalf("value %q spans parameters", v)
		}
		if ok && !strings.Contains(cmdline, key+"="+v) {
			t.Fatalf("value %q for %q is not on the line %q", v, key, cmdline)
		}
		if key == "" || strings.ContainsFunc(key+value, func(r rune) bool { return r == 0x85 || r == 0xA0 || r < 0x20 || r == ' ' || r > 0x7e }) {
			return // not something the host would put on the line
		}
		if got, ok := CmdlineValue(cmdline+" "+key+"="+value, key); !ok || got != value {
			t.Fatalf("appended %s=%s, read %q %v", key, value, got, ok)
		}
	})
}
