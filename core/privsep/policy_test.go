package privsep

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestPolicyRoundTrip(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	scratch, cache, ro := t.TempDir(), t.TempDir(), t.TempDir()
	p, err := buildPolicy(Spec{Executable: exe, Scratch: scratch, CacheDir: cache, ReadOnly: []string{ro + "/"}, LandlockBestEffort: true})
	if err != nil {
		t.Fatalf("buildPolicy: %v", err)
	}
	enc, err := encodePolicy(p)
	if err != nil {
		t.Fatalf("encodePolicy: %v", err)
	}
	got, err := decodePolicy(enc)
	if err != nil {
		t.Fatalf("decodePolicy: %v", err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("round trip changed the policy:\n%+v\n%+v", got, p)
	}
	want := map[string]access{exe: accessReadExec, scratch: accessReadWrite, cache: accessRWExec, ro: accessRead}
	for _, r := range p.Rules {
		if a, ok := want[r.Path]; ok {
			if r.Access != a || r.Optional {
				t.Errorf("rule for %s = %+v, want required %q", r.Path, r, a)
			}
			delete(want, r.Path)
		}
		if r.Path == "/etc" {
			t.Errorf("policy grants all of /etc")
		}
	}
	if len(want) != 0 {
		t.Errorf("missing rules for %v", want)
	}
	if !p.BestEffort {
		t.Errorf("best effort flag lost")
	}
}

func TestBuildPolicyErrors(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	session := t.TempDir()
	db := filepath.Join(session, "session.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(session, link); err != nil {
		t.Fatal(err)
	}
	ok := Spec{Executable: exe, Scratch: scratch, Protect: []string{session, db}}
	if _, err := buildPolicy(ok); err != nil {
		t.Fatalf("buildPolicy with disjoint protect: %v", err)
	}
	cases := []struct {
		name    string
		mod     func(*Spec)
		wantErr string
	}{
		{"relative read-only", func(s *Spec) { s.ReadOnly = []string{"etc"} }, "not absolute"},
		{"missing read-write", func(s *Spec) { s.ReadWrite = []string{"/nonexistent/privsep"} }, "no such file"},
		{"empty exec path", func(s *Spec) { s.Exec = []string{""} }, "empty path"},
		{"NUL in path", func(s *Spec) { s.ReadOnly = []string{"/tmp/\x00"} }, "NUL"},
		{"invalid UTF-8 path", func(s *Spec) { s.ReadOnly = []string{"/tmp/\xff"} }, "UTF-8"},
		{"grant of the protected dir", func(s *Spec) { s.ReadOnly = []string{session} }, "overlaps protected"},
		{"grant above the protected file", func(s *Spec) { s.ReadWrite = []string{filepath.Dir(session)} }, "overlaps protected"},
		{"grant inside the protected dir", func(s *Spec) { s.ReadOnly = []string{db} }, "overlaps protected"},
		{"grant through a symlink", func(s *Spec) { s.Exec = []string{link} }, "overlaps protected"},
		{"scratch inside the protected dir", func(s *Spec) { s.Scratch = session }, "overlaps protected"},
		{"relative protect", func(s *Spec) { s.Protect = []string{"session.db"} }, "not absolute"},
		{"too many rules", func(s *Spec) {
			for range maxRules {
				s.ReadOnly = append(s.ReadOnly, "/usr")
			}
		}, "more than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ok
			tc.mod(&s)
			if _, err := buildPolicy(s); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("buildPolicy error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestDecodePolicyRejects(t *testing.T) {
	enc := func(v any) string {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return policyEncoding.EncodeToString(raw)
	}
	cases := []struct {
		name, in, wantErr string
	}{
		{"empty", "", "empty"},
		{"not base64", "!!!", "base64"},
		{"padded base64", policyEncoding.EncodeToString([]byte(`{"v":1}`)) + "==", "base64"},
		{"not json", policyEncoding.EncodeToString([]byte("nope")), "JSON"},
		{"trailing data", policyEncoding.EncodeToString([]byte(`{"v":1}{"v":1}`)), "trailing"},
		{"unknown field", enc(map[string]any{"v": 1, "allow_all": true}), "unknown field"},
		{"wrong version", enc(map[string]any{"v": 2}), "version"},
		{"relative path", enc(map[string]any{"v": 1, "rules": []any{map[string]any{"path": "usr", "access": "r"}}}), "not absolute"},
		{"unclean path", enc(map[string]any{"v": 1, "rules": []any{map[string]any{"path": "/usr/../etc", "access": "r"}}}), "not clean"},
		{"unknown access", enc(map[string]any{"v": 1, "rules": []any{map[string]any{"path": "/usr", "access": "all"}}}), "unknown access"},
		{"too long", strings.Repeat("A", maxEncodedPolicy+1), "more than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodePolicy(tc.in); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("decodePolicy error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// FuzzDecodePolicy checks that the first stage's decoder never panics and
// that whatever it accepts is valid and survives a round trip unchanged.
func FuzzDecodePolicy(f *testing.F) {
	good, err := encodePolicy(policy{Version: policyVersion, BestEffort: true, Rules: []rule{
		{Path: "/usr", Access: accessReadExec, Optional: true},
		{Path: "/dev/null", Access: accessDevice},
		{Path: "/tmp/scratch", Access: accessReadWrite},
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add("")
	f.Add("e30")                         // {}
	f.Add("eyJ2IjoxfQ")                  // {"v":1}
	f.Add("eyJ2IjoxLCJydWxlcyI6bnVsbH0") // {"v":1,"rules":null}
	f.Add(good[:len(good)/2])
	f.Fuzz(func(t *testing.T, s string) {
		p, err := decodePolicy(s)
		if err != nil {
			return
		}
		if p.Version != policyVersion || len(p.Rules) > maxRules {
			t.Fatalf("accepted invalid policy %+v", p)
		}
		for _, r := range p.Rules {
			if !filepath.IsAbs(r.Path) || filepath.Clean(r.Path) != r.Path || strings.ContainsRune(r.Path, 0) || !r.Access.valid() {
				t.Fatalf("accepted invalid rule %+v", r)
			}
		}
		again, err := encodePolicy(p)
		if err != nil {
			// JSON escaping may grow an input that was just under the size
			// limit; anything else is a bug.
			if strings.Contains(err.Error(), "more than") {
				return
			}
			t.Fatalf("re-encode accepted policy: %v", err)
		}
		p2, err := decodePolicy(again)
		if err != nil {
			t.Fatalf("decode re-encoded policy: %v", err)
		}
		if !reflect.DeepEqual(p, p2) {
			t.Fatalf("round trip changed the policy:\n%+v\n%+v", p, p2)
		}
	})
}
