package guestwire

import (
	"maps"
	"strings"
	"testing"
)

func TestParseImageEnv(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]string
		err      string
	}{
		{"empty", "", map[string]string{}, ""},
		{"lines", "PATH=/usr/local/bin:/usr/bin\nSHELL=/bin/bash\r\n\n# a comment\nIS_SANDBOX=1\n",
			map[string]string{"PATH": "/usr/local/bin:/usr/bin", "SHELL": "/bin/bash", "IS_SANDBOX": "1"}, ""},
		{"literal value", "A=\"x y\" $HOME=z", map[string]string{"A": "\"x y\" $HOME=z"}, ""},
		{"empty value", "EMPTY=", map[string]string{"EMPTY": ""}, ""},
		{"last wins", "A=1\nA=2", map[string]string{"A": "2"}, ""},
		{"no equals", "A=1\nJUSTAWORD\n", nil, "line 2: no '='"},
		{"bad name", "1A=x", nil, `line 1: "1A" is not a variable name`},
		{"dash in name", "A-B=x", nil, "not a variable name"},
		{"empty name", "=x", nil, "not a variable name"},
		{"refused name", "LD_PRELOAD=/tmp/x.so", nil, "LD_* variables"},
		{"shell injection", "BASH_ENV=/tmp/x", nil, "changes how the shell runs"},
		{"NUL", "A=x\x00y", nil, "NUL"},
		{"too large", strings.Repeat("A=1\n", MaxImageEnv/4+1), nil, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseImageEnv([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseImageEnv(f *testing.F) {
	f.Add([]byte("PATH=/usr/bin\nSHELL=/bin/bash\n"))
	f.Add([]byte("# c\n\nA=1\r\nB==2\n"))
	f.Add([]byte("LD_PRELOAD=x"))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := ParseImageEnv(data)
		if err != nil {
			return
		}
		if err := ValidateEnv(env); err != nil {
			t.Fatalf("accepted an environment ValidateEnv refuses: %v", err)
		}
		for k := range env {
			if !validEnvName(k) {
				t.Fatalf("accepted name %q", k)
			}
		}
	})
}
