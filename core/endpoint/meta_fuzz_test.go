package endpoint

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/capsem/capsem/core/mcpframe"
)

// FuzzReadMeta: the relay's metadata line yields a process name and a trace
// id safe for a frame and a ledger row, and leaves the stream right after its newline (or
// untouched when there is no metadata line).
func FuzzReadMeta(f *testing.F) {
	f.Add([]byte(mcpframe.MetaPrefix+"claude\n\x00\x00\x00\x10rest"), true)
	f.Add([]byte(mcpframe.MetaPrefix+"bad\xffname with spaces\x01\n"), true)
	f.Add([]byte(mcpframe.MetaPrefix+strings.Repeat("n", 300)+"\n"), true)
	f.Add([]byte("\x00CAPSEM_MET"), false)
	f.Add([]byte(mcpframe.MetaPrefix), false)
	f.Add([]byte(mcpframe.MetaPrefix+"claude\ttrace=run-7\tnewer=1\n"), true)
	f.Add([]byte(mcpframe.MetaPrefix+"claude\ttrace=a b\n"), true)
	f.Fuzz(func(t *testing.T, stream []byte, _ bool) {
		c := &conn{}
		br := bufio.NewReader(bytes.NewReader(stream))
		err := c.readMeta(br)
		rest, _ := io.ReadAll(br)
		if !bytes.HasPrefix(stream, []byte(mcpframe.MetaPrefix)) {
			if err != nil || c.metaName != "" || !bytes.Equal(rest, stream) {
				t.Fatalf("no metadata line, yet err %v, name %q, %d of %d bytes left", err, c.metaName, len(rest), len(stream))
			}
			return
		}
		if err != nil {
			return // unterminated or over-long: the connection ends with this error
		}
		end := bytes.IndexByte(stream, '\n')
		if end < 0 || !bytes.Equal(rest, stream[end+1:]) {
			t.Fatalf("stream not left right after the metadata line")
		}
		if c.metaTrace != "" && mcpframe.CheckTraceID(c.metaTrace) != nil {
			t.Fatalf("unsafe trace id %q", c.metaTrace)
		}
		name := c.metaName
		if name == "" || len(name) > mcpframe.MaxNameLen || !utf8.ValidString(name) || strings.ContainsAny(name, " \n\r\t\x00") {
			t.Fatalf("unsafe process name %q", name)
		}
	})
}
