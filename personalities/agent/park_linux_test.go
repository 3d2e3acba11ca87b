package agent

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestwire"
)

// TestParkablePortKeepsTheWake: an armed port gives its session what comes
// before the wake's marker, however the marker is split across reads, then
// ends the session; the marker and what follows are the wake's.
func TestParkablePortKeepsTheWake(t *testing.T) {
	m := "\x00\x01this suspend's marker\x02"
	for name, writes := range map[string][]string{
		"whole":          {"session bytes", m + "WAKE"},
		"split marker":   {"session bytes" + m[:4], m[4:9], m[9:] + "WAKE"},
		"marker at once": {m + "WAKE"},
		"false start":    {"session " + m[:3], "bytes", m + "WAKE"},
		// Another marker (a saved boot's, or another suspend's) is data.
		"another marker": {"session " + guestwire.WakeMarker, m + "WAKE"},
	} {
		t.Run(name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			defer w.Close()
			p := newParkablePort(r)
			p.arm([]byte(m))
			go func() {
				for _, s := range writes {
					w.WriteString(s)
					time.Sleep(10 * time.Millisecond)
				}
			}()
			var session []byte
			buf := make([]byte, 7)
			for {
				n, err := p.Read(buf)
				session = append(session, buf[:n]...)
				if errors.Is(err, net.ErrClosed) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			want := strings.TrimSuffix(strings.Join(writes, ""), m+"WAKE")
			if string(session) != want {
				t.Errorf("the session got %q, want %q", session, want)
			}
			held, f, err := p.release()
			if err != nil {
				t.Fatal(err)
			}
			wake := io.MultiReader(bytes.NewReader(held), f)
			got := make([]byte, len(m)+4)
			if _, err := io.ReadFull(wake, got); err != nil || string(got) != m+"WAKE" {
				t.Errorf("the wake got %q, %v", got, err)
			}
		})
	}
}

// TestParkablePortClose: Close ends a read in progress and leaves the
// file open for the next user.
func TestParkablePortClose(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	p := newParkablePort(r)
	done := make(chan error, 1)
	go func() {
		_, err := p.Read(make([]byte, 8))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	p.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("read: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the read")
	}
	held, f, err := p.release()
	if err != nil || f != r || len(held) != 0 {
		t.Fatal(err, len(held))
	}
	wake := io.Reader(f)
	w.WriteString("next")
	got := make([]byte, 4)
	if _, err := io.ReadFull(wake, got); err != nil || string(got) != "next" {
		t.Errorf("after release: %q, %v", got, err)
	}
}
