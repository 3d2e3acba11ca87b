package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestwire"
)

// wakeHooks are what the wake changes in the guest, replaceable in tests.
type wakeHooks struct {
	addEntropy func(seed []byte) error
	setClock   func(time.Time) error
}

var systemWake = wakeHooks{addEntropy: reseedKernelRandom, setClock: setClock}

// wakeHandshake is the guest side of the wake handshake (guestwire.Wake) on
// the raw channel port: it says save_point, waits for the wake, and
// applies it: the seed first, so nothing random is drawn from the saved
// state after a restore, then the clock. The wait is bounded by ctx; the
// monotonic clock a deadline uses does not advance while a VM is saved.
func wakeHandshake(ctx context.Context, port io.ReadWriter, h wakeHooks) (*guestwire.Wake, error) {
	if err := guestwire.NewWriter(port).Write(&guestwire.Message{Type: guestwire.TypeSavePoint}); err != nil {
		return nil, fmt.Errorf("agent: writing the save point to the host: %w", err)
	}
	return awaitWake(ctx, port, guestwire.WakeMarker, h)
}

// awaitWake reads the host's wake (past marker, skipping whatever comes
// before it) and applies it: the seed first, so nothing random is
// drawn from the saved state after a restore, then the clock. The wait is
// bounded by ctx.
func awaitWake(ctx context.Context, port io.Reader, marker string, h wakeHooks) (*guestwire.Wake, error) {
	if d, ok := port.(interface{ SetReadDeadline(time.Time) error }); ok {
		if dl, ok := ctx.Deadline(); ok {
			d.SetReadDeadline(dl)
			defer d.SetReadDeadline(time.Time{})
		}
	}
	var m guestwire.Message
	err := skipToMarker(port, marker)
	if err == nil {
		err = readFrameExactly(port, &m)
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
		}
		return nil, fmt.Errorf("agent: waiting for the host's wake: %w", err)
	}
	if m.Type != guestwire.TypeWake {
		return nil, fmt.Errorf("agent: the host answered the save point with %q, want %q", m.Type, guestwire.TypeWake)
	}
	if err := guestwire.ValidateWake(m.Wake); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err := h.addEntropy(m.Wake.Seed); err != nil {
		return nil, fmt.Errorf("agent: seeding the kernel's random generator from the wake: %w", err)
	}
	if m.Wake.ClockUnixNano > 0 {
		if err := h.setClock(time.Unix(0, m.Wake.ClockUnixNano)); err != nil {
			return nil, fmt.Errorf("agent: setting the clock from the wake: %w", err)
		}
	}
	return m.Wake, nil
}

// readFrameExactly reads one control frame ([u32 BE length][msgp]) from r
// and not a byte more: what follows the wake is the multiplexer's, and a
// buffered reader would take some of it.
func readFrameExactly(r io.Reader, m *guestwire.Message) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > guestwire.MaxFrame {
		return fmt.Errorf("a frame of %d bytes, more than %d", n, guestwire.MaxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	return guestwire.Unmarshal(body, m)
}

// skipToMarker reads r one byte at a time up to and including marker, so
// that nothing after it is consumed.
func skipToMarker(r io.Reader, marker string) error {
	var b [1]byte
	matched := 0
	for matched < len(marker) {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return err
		}
		switch {
		case b[0] == marker[matched]:
			matched++
		case b[0] == marker[0]:
			matched = 1
		default:
			matched = 0
		}
	}
	return nil
}

// reseedKernelRandom mixes seed into the kernel's input pool, credited as
// entropy (RNDADDENTROPY), and then makes the kernel reseed its generator
// from the pool at once (RNDRESEEDCRNG): every restored VM starts from the
// same saved generator state, and without the reseed would hand out the
// same "random" bytes until its next periodic reseed.
func reseedKernelRandom(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(seed)+3)
	binary.NativeEndian.PutUint32(info[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(seed)))
	copy(info[8:], seed)
	err = ioctl(f, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0])))
	runtime.KeepAlive(info)
	if err != nil {
		return fmt.Errorf("RNDADDENTROPY: %w", err)
	}
	if err := ioctl(f, unix.RNDRESEEDCRNG, 0); err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	return nil
}

// flushBlockDevice drops the kernel's cached blocks of dev (BLKFLSBUF). A
// restored VM's kernel may still cache blocks it read from the disk the
// saved VM had (the partition scan reads the first ones); this VM's disk
// is another file.
func flushBlockDevice(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("agent: opening %s to flush its cache: %w", dev, err)
	}
	defer f.Close()
	if err := ioctl(f, unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("agent: flushing the cached blocks of %s: %w", dev, err)
	}
	return nil
}

func ioctl(f *os.File, req uint, arg uintptr) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), arg)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}
