package guestwire

import "testing"

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
