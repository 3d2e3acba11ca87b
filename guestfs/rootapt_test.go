package guestfs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeFiles(t testing.TB, base string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(base, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDebianSources: the image gets the host's Debian archive for its
// suite and nothing else (no vendor repositories, no deb-src, no other
// suites, no disabled entries).
func TestDebianSources(t *testing.T) {
	etc := t.TempDir()
	writeFiles(t, etc, map[string]string{
		"sources.list": `# the host's old-style list
deb http://mirror.example/debian bookworm main contrib
deb-src http://mirror.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://security.example/debian-security bookworm-security main # trailing comment
deb [signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.example/linux/debian bookworm stable
deb http://mirror.example/debian trixie main
`,
		"sources.list.d/debian.sources": `Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://deb.example/debian
Suites: bookworm bookworm-updates bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://deb.example/debian-security
Suites: bookworm-security
Components: main non-free-firmware
`,
		"sources.list.d/vendor.sources": `Types: deb
URIs: https://vendor.example/node
Suites: nodistro
Components: main
Signed-By: /usr/share/keyrings/vendor.gpg
`,
		"sources.list.d/off.sources": `Types: deb
URIs: http://off.example/debian
Suites: bookworm
Components: main
Enabled: no
`,
		"sources.list.d/disabled.list.disabled-by-farm": "deb http://ignored.example/debian bookworm main\n",
	})
	got, err := debianSources(etc, "bookworm")
	if err != nil {
		t.Fatal(err)
	}
	want := `Types: deb
URIs: http://mirror.example/debian
Suites: bookworm
Components: main contrib

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.example/debian-security
Suites: bookworm-security
Components: main non-free-firmware
`
	if string(got) != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	// Its own output reads back the same.
	again, err := parseDeb822Sources(got)
	if err != nil || string(formatDeb822(again)) != want {
		t.Fatalf("round trip: %v\n%s", err, formatDeb822(again))
	}

	if _, err := debianSources(etc, "buster"); err == nil || !strings.Contains(err.Error(), "no Debian archive for buster") || !strings.Contains(err.Error(), "debian.sources") {
		t.Fatalf("a suite the host lacks: %v", err)
	}
	writeFiles(t, etc, map[string]string{"sources.list.d/broken.sources": "Types: deb\nComponents: main\n"})
	if _, err := debianSources(etc, "bookworm"); err == nil || !strings.Contains(err.Error(), "broken.sources") {
		t.Fatalf("a broken file: %v", err)
	}
}

func TestParseOneLineSourcesErrors(t *testing.T) {
	for _, bad := range []string{"deb [signed-by=/x http://a bookworm main\n", "deb http://a\n"} {
		if _, err := parseOneLineSources([]byte(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// aptSimOutput is the shape of apt-get -s output (trimmed from a real run).
const aptSimOutput = `NOTE: This is only a simulation!
      apt-get needs root privileges for real execution.
Reading package lists...
Building dependency tree...
The following NEW packages will be installed:
  apt base-files curl libc6
Inst gcc-12-base (12.2.0-14+deb12u1 Debian:12.15/oldstable [amd64])
Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []
Inst base-files [12.4+deb12u14] (12.4+deb12u15 Debian:12.15/oldstable [amd64])
Inst libfoo:i386 (1.0-1 Debian:12.15/oldstable [i386])
Inst curl (7.88.1-10+deb12u15 Debian-Security:12/oldstable-security [amd64])
Conf gcc-12-base (12.2.0-14+deb12u1 Debian:12.15/oldstable [amd64])
Conf curl (7.88.1-10+deb12u15 Debian-Security:12/oldstable-security [amd64])
`

func TestParseAptSimulation(t *testing.T) {
	got, err := parseAptSimulation([]byte(aptSimOutput))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"base-files=12.4+deb12u15", "curl=7.88.1-10+deb12u15", "gcc-12-base=12.2.0-14+deb12u1", "libc6=2.36-9+deb12u14", "libfoo=1.0-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if _, err := parseAptSimulation([]byte("Reading package lists...\n")); err == nil {
		t.Fatal("an empty simulation was accepted")
	}
	if _, err := parseAptSimulation([]byte("Inst curl\n")); err == nil || !strings.Contains(err.Error(), `"Inst curl"`) {
		t.Fatalf("a line without a version: %v", err)
	}
}

func TestInstalledPackages(t *testing.T) {
	status := `Package: libc6
Status: install ok installed
Version: 2.36-9+deb12u14
Description: GNU C Library
 continued description

Package: removed
Status: deinstall ok config-files
Version: 1.0

Package: curl
Status: install ok installed
Architecture: amd64
Version: 7.88.1-10+deb12u15
`
	got, err := installedPackages([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"curl=7.88.1-10+deb12u15", "libc6=2.36-9+deb12u14"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := installedPackages([]byte("Status: install ok installed\nVersion: 1\n")); err == nil {
		t.Fatal("a record without Package was accepted")
	}
	d := closureDiff([]string{"a=1", "b=1"}, []string{"a=1", "b=2"})
	if !strings.Contains(d, "expected but not installed: [b=1]") || !strings.Contains(d, "installed but not expected: [b=2]") {
		t.Fatalf("closureDiff: %s", d)
	}
}

func TestParseMountsUnder(t *testing.T) {
	info := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw
40 22 0:21 / /work/a/.root-build-1/tree/proc rw - proc proc rw
41 22 0:5 / /work/a/.root-build-1/tree/dev rw - devtmpfs udev rw
42 41 0:22 / /work/a/.root-build-1/tree/dev/pts rw - devpts devpts rw
43 22 0:23 / /work/a/.root-build-1/with\040space rw - tmpfs t rw
44 22 0:24 / /work/a/.root-build-10/x rw - tmpfs t rw
45 22 0:25 / /work/a/.root-build-1 rw - tmpfs t rw
`
	got := parseMountsUnder([]byte(info), "/work/a/.root-build-1/")
	want := []string{"/work/a/.root-build-1/tree/dev/pts", "/work/a/.root-build-1/with space", "/work/a/.root-build-1/tree/proc", "/work/a/.root-build-1/tree/dev"}
	if len(got) != len(want) || got[0] != want[0] {
		t.Fatalf("got %v, want %v (deepest first)", got, want)
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Fatalf("got %v, lacks %s", got, w)
		}
	}
}
