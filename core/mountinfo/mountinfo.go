// Package mountinfo reads Linux's /proc/<pid>/mountinfo: the guest agent
// asks it what is mounted, and capsem-doctor checks the guest's mounts
// with it. It builds without cgo.
package mountinfo

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Entry is one mount: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3
// /dev/root rw,errors=continue" is Root /mnt1, Target /mnt2, Options
// rw,noatime, FSType ext3, Source /dev/root, Super rw,errors=continue.
type Entry struct {
	Major, Minor uint32
	Root         string
	Target       string
	Options      string // per-mount options
	FSType       string
	Source       string
	Super        string // per-superblock options
}

// Self reads the calling process's mount table.
func Self() ([]Entry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	return Parse(b), nil
}

// Parse reads mountinfo lines, skipping malformed ones.
func Parse(b []byte) []Entry {
	var out []Entry
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 6 || sep+2 >= len(f) {
			continue
		}
		e := Entry{Root: Unescape(f[3]), Target: Unescape(f[4]), Options: f[5], FSType: f[sep+1], Source: Unescape(f[sep+2])}
		fmt.Sscanf(f[2], "%d:%d", &e.Major, &e.Minor)
		if sep+3 < len(f) {
			e.Super = f[sep+3]
		}
		out = append(out, e)
	}
	return out
}

// At is the topmost mount on target.
func At(ms []Entry, target string) (Entry, bool) {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Target == target {
			return ms[i], true
		}
	}
	return Entry{}, false
}

// Option is the value of key=value in a comma-separated option list.
func Option(opts, key string) string {
	for _, o := range strings.Split(opts, ",") {
		if v, ok := strings.CutPrefix(o, key+"="); ok {
			return v
		}
	}
	return ""
}

// Unescape undoes mountinfo's octal escapes (\040 for a space).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
