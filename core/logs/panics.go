package logs

import (
	"bufio"
	"encoding/json"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Panic is a Go panic, fatal error or crash by a signal found in a log:
// what the runtime wrote to the crashing process's stderr, which capsem
// points at the process's log.
type Panic struct {
	// Time is the time of the last log record before the panic (the
	// runtime's report has none of its own); "" when none precedes it.
	Time string `json:"ts,omitempty"`
	// Message is the panic's value ("panic: " or "fatal error: " cut),
	// nested panics' after it, one a line.
	Message string `json:"message"`
	Fatal   bool   `json:"fatal,omitempty"` // a fatal error or a signal, not a panic
	// Goroutine is the crashing goroutine's number, 0 when the report
	// has none.
	Goroutine int `json:"goroutine,omitempty"`
	// Location is where the panic was raised (the frame below the first
	// panic() of the trace), else the first frame of the program's own
	// code (outside the Go distribution), else the first outside the
	// runtime: the function and its file:line.
	Location string `json:"location,omitempty"`
	// Frames are the crashing goroutine's frames, "function file:line",
	// at most MaxPanicFrames.
	Frames []string `json:"frames,omitempty"`
}

// Bounds of what FindPanics keeps.
const (
	MaxPanicFrames  = 64
	MaxPanicMessage = 4 << 10
	maxPanicLine    = 64 << 10
)

// goroutineHeader is a trace's first line: "goroutine 7 [running]:", or
// with the scheduler's details in a signal's dump ("goroutine 0 gp=0x…
// m=0 mp=0x… [idle]:").
var goroutineHeader = regexp.MustCompile(`^goroutine (\d+) (?:[^\[]* )?\[[^\]]*\]:$`)

// signalReport is the first line of a crash by a signal the Go runtime
// reports itself ("SIGSEGV: segmentation violation", "SIGQUIT: quit").
var signalReport = regexp.MustCompile(`^SIG[A-Z]+: [a-z ]+$`)

// FindPanics reads a log and returns the panics and fatal errors in it, in
// order. Lines past maxPanicLine are cut; nothing in the log makes it fail.
func FindPanics(r io.Reader) []Panic {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxPanicLine)
	var out []Panic
	var lastTime string
	var cur *Panic
	// state within a report: message lines, then the goroutine header,
	// then frames (a function line, then its file line).
	const (
		none = iota
		message
		header
		frames
	)
	state := none
	var function string
	var afterPanic, panicked bool
	var firstFunction string // the function of Location's frame
	finish := func() {
		if cur != nil {
			out = append(out, *cur)
		}
		cur, state, function, afterPanic, panicked, firstFunction = nil, none, "", false, false, ""
	}
	for sc.Scan() {
		line := sc.Text()
		if msg, fatal, ok := panicStart(line); ok {
			finish()
			cur = &Panic{Time: lastTime, Message: capText(msg, MaxPanicMessage), Fatal: fatal}
			state = message
			continue
		}
		switch state {
		case none:
			if t := recordTime(line); t != "" {
				lastTime = t
			}
		case message:
			switch {
			case strings.HasPrefix(line, "\tpanic: "), strings.HasPrefix(line, "\t[signal "), strings.HasPrefix(line, "[signal "):
				cur.Message = capText(cur.Message+"\n"+strings.TrimSpace(line), MaxPanicMessage)
			case strings.HasPrefix(line, "PC=") || strings.HasPrefix(line, "signal arrived during"):
				// A signal's registers and context: not part of the message.
			case line == "":
				state = header
			default:
				finish()
			}
		case header:
			if m := goroutineHeader.FindStringSubmatch(line); m != nil {
				cur.Goroutine, _ = strconv.Atoi(m[1])
				state = frames
			} else if line != "" {
				finish() // a report without a trace (GOTRACEBACK=none)
			}
		case frames:
			switch {
			case line == "":
				finish()
			case strings.HasPrefix(line, "\t"):
				if function == "" {
					continue
				}
				file := strings.TrimSpace(line)
				if i := strings.LastIndex(file, " +0x"); i >= 0 {
					file = file[:i]
				}
				frame := function + " " + file
				if len(cur.Frames) < MaxPanicFrames {
					cur.Frames = append(cur.Frames, frame)
				}
				switch {
				case strings.HasPrefix(function, "panic("):
					afterPanic = true
				case afterPanic && !panicked:
					// The function that called panic: where the report's
					// panic was raised, whatever recovered and re-raised it
					// above.
					cur.Location, panicked = frame, true
				case !panicked && !stdlib(function) && (cur.Location == "" || stdlib(firstFunction)):
					// No panic() (a fatal error, a signal): the first frame
					// of the program's own code.
					cur.Location, firstFunction = frame, function
				case cur.Location == "" && !strings.HasPrefix(function, "runtime."):
					cur.Location, firstFunction = frame, function
				}
				function = ""
			default:
				function = capText(line, 512)
			}
		}
	}
	finish()
	return out
}

// stdlib reports whether a trace's function is the Go distribution's: its
// package path's first element has no dot (a module's has its host name)
// and is not main.
func stdlib(function string) bool {
	function = strings.TrimPrefix(function, "created by ")
	first, _, slash := strings.Cut(function, "/")
	if !slash {
		first, _, _ = strings.Cut(function, ".")
		return first != "main"
	}
	return !strings.Contains(first, ".")
}

// panicStart reports whether line begins a runtime report.
func panicStart(line string) (msg string, fatal, ok bool) {
	if m, ok := strings.CutPrefix(line, "panic: "); ok {
		return m, false, true
	}
	if m, ok := strings.CutPrefix(line, "fatal error: "); ok {
		return m, true, true
	}
	if signalReport.MatchString(line) {
		return line, true, true
	}
	return "", false, false
}

// recordTime is a log record's time: a JSON line's "time", else a text
// line's leading RFC 3339 stamp; "" for neither.
func recordTime(line string) string {
	if strings.HasPrefix(line, "{") {
		var rec struct {
			Time string `json:"time"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil {
			return rec.Time
		}
		return ""
	}
	if f, _, ok := strings.Cut(line, " "); ok && len(f) >= 20 && f[4] == '-' && f[10] == 'T' {
		return f
	}
	return ""
}

func capText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
