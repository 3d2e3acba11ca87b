package guestchan

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderGolden(t *testing.T) {
	got := AppendHeader(nil, PortExecOutput)
	want := []byte{'C', 'S', 1, 0, 0x00, 0x00, 0x13, 0x8d}
	if !bytes.Equal(got, want) {
		t.Fatalf("header for 5005: % x, want % x", got, want)
	}
	port, err := ParseHeader(want)
	if err != nil || port != PortExecOutput {
		t.Fatalf("ParseHeader: %d %v", port, err)
	}
}

func TestParseHeaderRejects(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":    nil,
		"short":    {'C', 'S', 1, 0, 0, 0, 0x13},
		"long":     {'C', 'S', 1, 0, 0, 0, 0x13, 0x88, 0},
		"magic":    {'c', 's', 1, 0, 0, 0, 0x13, 0x88},
		"version0": {'C', 'S', 0, 0, 0, 0, 0x13, 0x88},
		"version2": {'C', 'S', 2, 0, 0, 0, 0x13, 0x88},
		"reserved": {'C', 'S', 1, 1, 0, 0, 0x13, 0x88},
	} {
		_, err := ParseHeader(b)
		if !errors.Is(err, ErrBadHeader) {
			t.Errorf("%s: %v, want ErrBadHeader", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}

func TestReplies(t *testing.T) {
	if err := parseReply(appendReply(nil, replyOK), 1); err != nil {
		t.Fatal(err)
	}
	if err := parseReply(appendReply(nil, replyNoListener), 77); !errors.Is(err, ErrNoListener) || err.Error() != "no listener on port 77" {
		t.Fatalf("no listener: %v", err)
	}
	for _, b := range [][]byte{appendReply(nil, 9), {'C', 'S', 1}, {'X', 'S', 1, 0}} {
		if err := parseReply(b, 1); !errors.Is(err, ErrBadHeader) {
			t.Fatalf("%q: %v", b, err)
		}
	}
}

func FuzzParseHeader(f *testing.F) {
	f.Add(AppendHeader(nil, PortControl))
	f.Add(AppendHeader(nil, 0xffffffff))
	f.Add([]byte{'C', 'S', 2, 0, 0, 0, 0, 0})
	f.Add([]byte("CS"))
	f.Fuzz(func(t *testing.T, b []byte) {
		port, err := ParseHeader(b)
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error not wrapping ErrBadHeader: %v", err)
			}
			return
		}
		// Anything accepted is exactly what AppendHeader writes.
		if again := AppendHeader(nil, port); !bytes.Equal(again, b) {
			t.Fatalf("accepted % x, which re-encodes as % x", b, again)
		}
		// Replies never panic either.
		_ = parseReply(b[:min(len(b), ReplySize)], port)
	})
}

// FuzzParseReply: only a well-formed OK reply accepts the stream; every
// refusal is an ErrBadHeader or ErrNoListener naming the port.
func FuzzParseReply(f *testing.F) {
	f.Add(appendReply(nil, replyOK))
	f.Add(appendReply(nil, replyNoListener))
	f.Add(appendReply(nil, replyBadHeader))
	f.Add([]byte("CS\x01\x09"))
	f.Add([]byte("xx"))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := parseReply(b, 5002)
		if err == nil {
			if !bytes.Equal(b[:2], []byte{magic0, magic1}) || len(b) != ReplySize || b[3] != replyOK {
				t.Fatalf("accepted reply % x", b)
			}
			return
		}
		if !errors.Is(err, ErrBadHeader) && !errors.Is(err, ErrNoListener) {
			t.Fatalf("refusal of kind %v", err)
		}
		if !bytes.Contains([]byte(err.Error()), []byte("5002")) {
			t.Fatalf("refusal does not name the port: %v", err)
		}
	})
}
