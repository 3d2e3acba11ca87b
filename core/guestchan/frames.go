package guestchan

import (
	"encoding/binary"
	"io"
	"sync"
)

// yamux's wire format (its spec.md): every frame is a 12-byte header
// (version, type, flags u16, stream id u32, length u32), followed by length
// bytes of body for a data frame only.
const (
	yamuxHeaderSize       = 12
	yamuxTypeData         = 0
	yamuxTypeWindowUpdate = 1
	yamuxFlagRST          = 8
)

// appendRST appends a window-update frame with the RST flag for stream id.
func appendRST(dst []byte, id uint32) []byte {
	dst = append(dst, 0, yamuxTypeWindowUpdate)
	dst = binary.BigEndian.AppendUint16(dst, yamuxFlagRST)
	dst = binary.BigEndian.AppendUint32(dst, id)
	return binary.BigEndian.AppendUint32(dst, 0)
}

// frameReader hands yamux the peer's bytes, and can slip in frames of its
// own between two of the peer's: a reset "from the peer" for a stream this
// side is done with. yamux frees a stream only once both sides have closed
// it, so a stream the peer never closes (a hostile guest opens thousands)
// would stay in memory for as long as the session lives; the injected
// reset frees it at once. It tracks frame boundaries only: yamux itself
// checks everything else.
type frameReader struct {
	r io.Reader
	// onHeader, when set, sees each of the peer's frame headers before
	// yamux does; an error from it ends the session (the flow gate's).
	onHeader func(hdr []byte) error
	err      error

	mu     sync.Mutex
	inject []byte // whole frames, the first maybe partly handed out already

	// Only Read touches these.
	hdr  [yamuxHeaderSize]byte
	hdrN int    // bytes of the current frame's header passed on
	body uint32 // bytes of the current frame's body still to pass on
}

// reset queues a reset of stream id, handed to yamux at the next boundary
// between the peer's frames.
func (f *frameReader) reset(id uint32) {
	f.mu.Lock()
	f.inject = appendRST(f.inject, id)
	f.mu.Unlock()
}

func (f *frameReader) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	atBoundary := f.hdrN == 0 && f.body == 0
	f.mu.Lock()
	queued := len(f.inject) > 0
	if queued && atBoundary {
		n := copy(p, f.inject)
		f.inject = f.inject[n:]
		if len(f.inject) == 0 {
			f.inject = nil
		}
		f.mu.Unlock()
		return n, nil
	}
	f.mu.Unlock()
	if queued {
		// Stop at the end of the current frame, where the queue goes in.
		p = p[:min(len(p), f.untilBoundary())]
	}
	n, err := f.r.Read(p)
	if terr := f.track(p[:n]); terr != nil {
		// Nothing of these bytes reaches yamux: the session ends here.
		f.err = terr
		return 0, terr
	}
	return n, err
}

// untilBoundary is how many more bytes the current frame has, as far as
// is known (a header not yet complete counts up to its end).
func (f *frameReader) untilBoundary() int {
	if f.hdrN > 0 {
		return yamuxHeaderSize - f.hdrN
	}
	return int(min(f.body, 1<<30))
}

// track follows the frame boundaries through b, the next bytes passed on,
// showing each header to onHeader.
func (f *frameReader) track(b []byte) error {
	for len(b) > 0 {
		if f.body > 0 {
			n := uint32(min(uint64(len(b)), uint64(f.body)))
			f.body -= n
			b = b[n:]
			continue
		}
		n := copy(f.hdr[f.hdrN:], b)
		f.hdrN += n
		b = b[n:]
		if f.hdrN < yamuxHeaderSize {
			return nil
		}
		f.hdrN = 0
		if f.hdr[1] == yamuxTypeData {
			f.body = binary.BigEndian.Uint32(f.hdr[8:])
		}
		if f.onHeader != nil {
			if err := f.onHeader(f.hdr[:]); err != nil {
				return err
			}
		}
	}
	return nil
}
