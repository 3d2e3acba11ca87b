package envvars

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Bounds on the builtin tool server's limits, so that a typo cannot turn
// it into an unbounded fetcher.
const (
	maxHTTPBodyBytes int64 = 1 << 30
	maxHTTPTimeout         = time.Hour
)

// maxWholeSeconds is the most seconds a time.Duration holds.
const maxWholeSeconds = math.MaxInt64 / int64(time.Second)

var (
	// filePath is a file or directory name, taken as it is.
	filePath = kind[string]{name: "path", parse: func(v string) (string, error) { return v, nil }}

	// text is a value only its reader interprets (an npm spec, an encoded
	// policy, a trace id).
	text = kind[string]{name: "text", parse: func(v string) (string, error) { return v, nil }}

	// level is a log level, as kong's enum for --log-level spells it.
	level = kind[string]{name: "level", parse: oneOf("debug", "info", "warn", "error")}

	// accelerator names the VMs' accelerator (vmm.AccelKVM, vmm.AccelTCG).
	accelerator = kind[string]{name: "accelerator", parse: oneOf("kvm", "tcg")}

	// off is a switch only "off" throws; its readers ignore other values.
	off = kind[bool]{name: "off", parse: func(v string) (bool, error) {
		if v != "off" {
			return false, errors.New(`want off (any other value leaves it on)`)
		}
		return true, nil
	}}

	// flagBool is a boolean as kong reads one from the environment.
	flagBool = kind[bool]{name: "bool", parse: func(v string) (bool, error) {
		switch strings.ToLower(v) {
		case "true", "1", "yes":
			return true, nil
		case "false", "0", "no":
			return false, nil
		}
		return false, errors.New("want true, 1, yes, false, 0 or no")
	}}

	// switch10 is a boolean spelled 1, true, 0 or false, in any case.
	switch10 = kind[bool]{name: "bool", trim: true, parse: func(v string) (bool, error) {
		switch strings.ToLower(v) {
		case "1", "true":
			return true, nil
		case "0", "false":
			return false, nil
		}
		return false, errors.New("must be 1, true, 0 or false")
	}}

	// mebibytes is a number of MiB as kong reads an int (Go syntax: a sign,
	// 0x, 0o, 0b and _ allowed); its reader checks the range.
	mebibytes = kind[int]{name: "MiB", parse: func(v string) (int, error) {
		n, err := strconv.ParseInt(v, 0, strconv.IntSize)
		if err != nil {
			return 0, errors.New("want a whole number of MiB")
		}
		return int(n), nil
	}}

	// seconds is a positive whole number of seconds.
	seconds = kind[time.Duration]{name: "seconds", parse: func(v string) (time.Duration, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || int64(n) > maxWholeSeconds {
			return 0, fmt.Errorf("want a positive whole number of seconds (at most %d)", maxWholeSeconds)
		}
		return time.Duration(n) * time.Second, nil
	}}

	// count is a positive whole number.
	count = kind[int]{name: "count", parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, errors.New("want a positive integer")
		}
		return n, nil
	}}

	// toolSeconds is a comma list of server__tool=seconds.
	toolSeconds = kind[map[string]time.Duration]{name: "server__tool=seconds,...", parse: parseToolSeconds}

	// bodyBytes is a positive number of bytes, at most maxHTTPBodyBytes.
	bodyBytes = kind[int64]{name: "bytes", trim: true, parse: func(v string) (int64, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("not a whole number of bytes: %w", err)
		}
		if n <= 0 || n > maxHTTPBodyBytes {
			return 0, fmt.Errorf("must be between 1 and %d bytes", maxHTTPBodyBytes)
		}
		return n, nil
	}}

	// fractionalSeconds is a positive number of seconds, fractions allowed,
	// at most maxHTTPTimeout.
	fractionalSeconds = kind[time.Duration]{name: "seconds", trim: true, parse: func(v string) (time.Duration, error) {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("not a number of seconds: %w", err)
		}
		if math.IsNaN(secs) || secs <= 0 || secs > maxHTTPTimeout.Seconds() {
			return 0, fmt.Errorf("must be more than 0 and at most %d seconds", int(maxHTTPTimeout.Seconds()))
		}
		d := time.Duration(secs * float64(time.Second))
		if d <= 0 {
			return 0, errors.New("timeout rounds down to zero")
		}
		return d, nil
	}}

	// list is a comma list; blanks around entries and blank entries are
	// dropped, so "a.com, b.com," is two entries.
	list = kind[[]string]{name: "list", trim: true, parse: func(v string) ([]string, error) {
		var entries []string
		for entry := range strings.SplitSeq(v, ",") {
			if entry = strings.TrimSpace(entry); entry != "" {
				entries = append(entries, entry)
			}
		}
		return entries, nil
	}}

	// unixEndpoint is unix:PATH; the value is PATH.
	unixEndpoint = kind[string]{name: "unix:PATH", parse: func(v string) (string, error) {
		p, ok := strings.CutPrefix(v, "unix:")
		if !ok || p == "" {
			return "", errors.New("want unix:PATH")
		}
		return p, nil
	}}

	// pid is a process id.
	pid = kind[int]{name: "pid", parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, errors.New("not a pid")
		}
		return n, nil
	}}
)

// oneOf parses one of values, exactly as spelled.
func oneOf(values ...string) func(string) (string, error) {
	want := strings.Join(values[:len(values)-1], ", ") + " or " + values[len(values)-1]
	return func(v string) (string, error) {
		for _, ok := range values {
			if v == ok {
				return v, nil
			}
		}
		return "", errors.New("want " + want)
	}
}

// parseToolSeconds parses server__tool=seconds,...: every item names a
// namespaced tool and a positive whole number of seconds.
func parseToolSeconds(v string) (map[string]time.Duration, error) {
	timeouts := map[string]time.Duration{}
	for item := range strings.SplitSeq(v, ",") {
		name, secs, ok := strings.Cut(strings.TrimSpace(item), "=")
		n, err := strconv.Atoi(secs)
		if !ok || !strings.Contains(name, "__") || err != nil || n <= 0 || int64(n) > maxWholeSeconds {
			return nil, fmt.Errorf("item %q: want server__tool=positive-seconds", item)
		}
		timeouts[name] = time.Duration(n) * time.Second
	}
	return timeouts, nil
}
