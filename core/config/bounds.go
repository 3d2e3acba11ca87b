package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Bounds on configuration input, which may come from files other tools
// write (AI CLI settings) or from whoever can write $CAPSEM_HOME.
const (
	// MaxFileBytes bounds a TOML configuration file.
	MaxFileBytes = 1 << 20
	// MaxSettingsBytes bounds an AI CLI settings file, which may keep a
	// long history of its own (Claude Code's ~/.claude.json does).
	MaxSettingsBytes = 64 << 20
	// MaxNesting bounds how deep arrays and inline tables nest in a TOML
	// file: the decoder's cost grows with depth far faster than with size.
	MaxNesting = 32
	// maxListedKeys bounds how many unknown keys an error names.
	maxListedKeys = 10
)

// readBounded reads a regular file of at most max bytes. Anything else (a
// FIFO, a device such as /dev/zero, a directory) is refused by what it is,
// before a byte is read: opening is non-blocking, so a FIFO with no writer
// cannot hang the reader.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fileKind(st.Mode()))
	}
	if st.Size() > max {
		return nil, fmt.Errorf("%s is %d bytes; the limit is %d", path, st.Size(), max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s grew past %d bytes while it was read", path, max)
	}
	return data, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return m.Type().String()
}

// errNesting is wrapped by checkNesting's error.
var errNesting = errors.New("nested too deeply")

// checkNesting refuses TOML text whose arrays and inline tables nest deeper
// than max, without decoding it: a scan that knows TOML's strings (basic,
// literal and their multi-line forms, with escapes) and comments, so
// brackets inside them do not count.
func checkNesting(data []byte, max int) error {
	depth, line := 0, 1
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case '\n':
			line++
		case '#':
			for i < len(data) && data[i] != '\n' {
				i++
			}
			i-- // the newline counts the line
		case '"', '\'':
			end, lines, err := skipString(data, i)
			if err != nil {
				return nil // the decoder reports a broken string better
			}
			line += lines
			i = end
		case '[', '{':
			depth++
			if depth > max {
				return fmt.Errorf("line %d: %w: more than %d arrays and inline tables inside one another", line, errNesting, max)
			}
		case ']', '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return nil
}

// skipString returns the index of the last byte of the string starting at
// i, and how many newlines it holds.
func skipString(data []byte, i int) (end, lines int, err error) {
	q := data[i]
	multi := i+2 < len(data) && data[i+1] == q && data[i+2] == q
	j := i + 1
	if multi {
		j = i + 3
	}
	for ; j < len(data); j++ {
		c := data[j]
		switch {
		case c == '\\' && q == '"':
			j++
			if j < len(data) && data[j] == '\n' {
				lines++
			}
		case c == '\n':
			if !multi {
				return 0, 0, errors.New("newline in a single-line string")
			}
			lines++
		case c == q && !multi:
			return j, lines, nil
		case c == q && j+2 < len(data) && data[j+1] == q && data[j+2] == q:
			// A multi-line string may end with up to two more quotes
			// that belong to its content.
			j += 2
			for j+1 < len(data) && data[j+1] == q {
				j++
			}
			return j, lines, nil
		}
	}
	return 0, 0, errors.New("unterminated string")
}
