package guestctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"time"

	"github.com/capsem/capsem/core/guestwire"
)

// hostFileTransfers is how many file transfers one client runs at once;
// more wait for a slot. It stays below what the guest serves
// (guestwire.MaxFileTransfers), so the host never meets the guest's refusal.
const hostFileTransfers = guestwire.MaxFileTransfers / 2

// abandonAfter is how long a refused write waits for its copy to notice
// before it stops the copy's read of a slow sender (which leaves that
// sender's request unreadable, so only when it is slow).
const abandonAfter = 2 * time.Second

// A file's bytes never travel in a control frame: file_read and file_write
// move them on a data stream the guest opens for the request (port 5005,
// StreamHeader{ID, StreamFile}), and the answer, sent once the stream has
// ended, says how many bytes it carried. Neither end holds more of a file
// than a copy buffer, whatever its size.

// attachFileStream hands a file data stream to the transfer waiting for it,
// and reports whether one took it.
func (c *Client) attachFileStream(id uint64, conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.files[id]
	delete(c.files, id) // one stream per transfer: a second finds nobody
	if ch == nil {
		c.log.Debug("file stream for no waiting transfer", "id", id)
		return false
	}
	raiseWindow(conn)
	// Under the lock: a transfer giving up deletes its entry, then drains
	// its channel, so a stream is either drained there or never sent.
	ch <- conn // buffered for exactly this one
	return true
}

// Stat describes a file without following a final symbolic link.
func (c *Client) Stat(ctx context.Context, path string) (*guestwire.FileInfo, error) {
	res, err := c.fileOp(ctx, guestwire.TypeFileStat, &guestwire.FileRequest{Path: path})
	if err != nil {
		return nil, err
	}
	if res.Info == nil {
		return nil, fmt.Errorf("guestctl: the guest's stat of %s has no file info", path)
	}
	return res.Info, nil
}

// Mkdir creates a directory; with parents, missing parents too and an
// existing directory is not an error.
func (c *Client) Mkdir(ctx context.Context, path string, mode fs.FileMode, parents bool) error {
	_, err := c.fileOp(ctx, guestwire.TypeMkdir, &guestwire.FileRequest{Path: path, Mode: uint32(mode.Perm()), Parents: parents})
	return err
}

// fileOp sends a file request that moves no file content (stat, mkdir).
func (c *Client) fileOp(ctx context.Context, typ string, req *guestwire.FileRequest) (*guestwire.FileResult, error) {
	if err := guestwire.ValidatePath(req.Path); err != nil {
		return nil, err
	}
	resp, err := c.call(ctx, &guestwire.Message{Type: typ, File: req})
	if err != nil {
		return nil, err
	}
	return fileResult(resp)
}

func fileResult(resp *guestwire.Message) (*guestwire.FileResult, error) {
	if err := expect(resp, guestwire.TypeFileResult); err != nil {
		return nil, err
	}
	if resp.FileResult == nil {
		return &guestwire.FileResult{}, nil
	}
	return resp.FileResult, nil
}

// ReadFileTo copies a guest file into w as it streams. req.Path names the
// file; req.FollowSymlink and req.MaxSize apply as the protocol says. It
// returns the guest's answer (the file's info, and the bytes it sent) once
// every byte has reached w; a stream cut short, or a guest failure after
// the first byte, is an error even though w has had part of the file.
func (c *Client) ReadFileTo(ctx context.Context, req *guestwire.FileRequest, w io.Writer) (*guestwire.FileResult, error) {
	limit := req.MaxSize
	if limit == 0 {
		limit = guestwire.MaxFileSize
	}
	return c.transfer(ctx, guestwire.TypeFileRead, req, func(conn net.Conn, _ <-chan *guestwire.Message) (int64, *guestwire.Message, error) {
		// The guest stops at MaxSize, but one that does not must not reach
		// w with more: callers size their memory by it.
		n, err := io.CopyBuffer(w, io.LimitReader(conn, limit), make([]byte, guestwire.MaxChunk))
		if err == nil && n == limit {
			var more [1]byte
			if k, _ := io.ReadFull(conn, more[:]); k > 0 {
				err = guestwire.Errorf(guestwire.CodeTooLarge, "read %s: the guest sent more than the %d bytes asked for", req.Path, limit)
			}
		}
		return n, nil, err
	})
}

// WriteFileFrom replaces a guest file with what r yields, creating it (and,
// with req.Parents, its missing parent directories). When the guest refuses
// the rest of the file, r's Abandon method, if it has one, is called to
// end a read that waits on a slow sender. The guest writes a
// temporary file beside the target and renames it into place only once
// every byte has arrived and is synced, so a transfer that fails leaves the
// old file as it was. A symbolic link anywhere in the path is refused.
func (c *Client) WriteFileFrom(ctx context.Context, req *guestwire.FileRequest, r io.Reader) (*guestwire.FileResult, error) {
	return c.transfer(ctx, guestwire.TypeFileWrite, req, func(conn net.Conn, answer <-chan *guestwire.Message) (int64, *guestwire.Message, error) {
		type copied struct {
			n   int64
			err error
		}
		done := make(chan copied, 1)
		go func() {
			cw := guestwire.NewChunkWriter(conn)
			n, err := cw.ReadFrom(r)
			if err == nil {
				err = cw.End() // the file is whole
			}
			if err == nil {
				err = closeWrite(conn)
			}
			done <- copied{n, err}
		}()
		select {
		case cp := <-done:
			return cp.n, nil, cp.err
		case resp := <-answer:
			// The guest answered before the end of the data: it stopped
			// reading (disk full, too large). Unblock the copy, also a read
			// of r waiting on a slow sender, and report the guest's reason,
			// not the broken pipe it causes here.
			conn.Close()
			var cp copied
			select {
			case cp = <-done: // its next write failed
			case <-time.After(abandonAfter):
				// Still in a read of r: a sender too slow to wait for.
				if a, ok := r.(interface{ Abandon() }); ok {
					a.Abandon()
				}
				cp = <-done
			}
			return cp.n, resp, nil
		}
	})
}

// closeWrite ends our half of a stream, so the guest's reads end too; the
// end marker, not this, is what says the file is whole.
func closeWrite(conn net.Conn) error {
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return conn.Close()
}

// mover copies a transfer's bytes over its data stream. When it sees the
// guest's answer early it returns it, and transfer uses it instead of
// waiting for another.
type mover func(conn net.Conn, answer <-chan *guestwire.Message) (int64, *guestwire.Message, error)

func (c *Client) transfer(ctx context.Context, typ string, req *guestwire.FileRequest, move mover) (*guestwire.FileResult, error) {
	if err := guestwire.ValidatePath(req.Path); err != nil {
		return nil, err
	}
	if req.MaxSize < 0 || req.MaxSize > guestwire.MaxFileSize {
		return nil, guestwire.Errorf(guestwire.CodeTooLarge, "%s %s: max size %d is outside 0..%d", typ, req.Path, req.MaxSize, guestwire.MaxFileSize)
	}
	select {
	case c.transfers <- struct{}{}:
		defer func() { <-c.transfers }()
	case <-ctx.Done():
		return nil, fmt.Errorf("guestctl: %s %s: waiting for a transfer slot: %w", typ, req.Path, ctx.Err())
	case <-c.done:
		return nil, c.Err()
	}
	id := c.nextID.Add(1)
	streams := make(chan net.Conn, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.files[id] = streams
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.files, id)
		c.mu.Unlock()
		select { // a stream that came as we gave up
		case conn := <-streams:
			conn.Close()
		default:
		}
	}()
	r := *req
	answer, forget, err := c.send(ctx, &guestwire.Message{Type: typ, ID: id, File: &r})
	if err != nil {
		return nil, err
	}
	// Until its answer comes, the guest may be busy with the transfer
	// (blocked on a stream we stopped reading): leaving without the answer
	// tells it to stop, so its transfer slot comes back.
	answered := false
	defer func() {
		if !answered && c.Err() == nil {
			go c.cancel(id)
		}
	}()
	var conn net.Conn
	var early *guestwire.Message // the answer, when it overtook the stream
	select {
	case conn = <-streams:
	case resp := <-answer:
		answered = true
		if _, err := answerOf(typ, resp); err != nil {
			return nil, err // refused before any data moved (no such file, busy)
		}
		// The answer travels on the control stream and can overtake the
		// data stream's header, more so for a short file.
		early = resp
		timer := time.NewTimer(c.opts.StreamTimeout)
		defer timer.Stop()
		select {
		case conn = <-streams:
		case <-timer.C:
			return nil, fmt.Errorf("guestctl: %s %s: the guest answered, but its data stream did not come within %v", typ, req.Path, c.opts.StreamTimeout)
		case <-ctx.Done():
			return nil, fmt.Errorf("guestctl: %s %s: %w", typ, req.Path, ctx.Err())
		case <-c.done:
			return nil, c.Err()
		}
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("guestctl: %s %s: %w", typ, req.Path, ctx.Err())
	case <-c.done:
		forget()
		return nil, c.Err()
	}
	defer conn.Close()
	// Leaving (ctx) or losing the guest breaks the copy at once.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	stopLife := context.AfterFunc(c.life, func() { conn.Close() })
	defer stopLife()
	moved, seen, moveErr := move(conn, answer)
	if early == nil {
		early = seen
	}
	var resp *guestwire.Message
	switch {
	case early != nil:
		resp, err = answerOf(typ, early)
	case moveErr != nil:
		// The copy broke. If the guest broke it (it refused the write and
		// closed the stream), its answer says why; if this side did (its
		// writer or reader failed), the guest may be blocked on the stream
		// and is told to stop, and its answer is waited for only briefly.
		conn.Close()
		answered = true
		go c.cancel(id)
		wait, cancel := context.WithTimeout(ctx, c.opts.StreamTimeout)
		resp, err = c.await(wait, typ, answer, forget)
		cancel()
		var we *guestwire.Error
		if !errors.As(err, &we) {
			return nil, c.copyBroke(ctx, typ, req.Path, moved, moveErr)
		}
	default:
		resp, err = c.await(ctx, typ, answer, forget)
	}
	var we *guestwire.Error
	answered = answered || early != nil || err == nil || errors.As(err, &we)
	if err != nil {
		// The guest's reason (disk full, too large) explains a broken copy
		// better than the copy's own error.
		return nil, err
	}
	if moveErr != nil {
		return nil, c.copyBroke(ctx, typ, req.Path, moved, moveErr)
	}
	res, err := fileResult(resp)
	if err != nil {
		return nil, err
	}
	if res.Bytes != moved {
		return nil, fmt.Errorf("guestctl: %s %s: the guest counted %d bytes on the data stream, %d arrived: the transfer was cut short", typ, req.Path, res.Bytes, moved)
	}
	return res, nil
}

// copyBroke explains a copy that failed. Leaving (ctx) or losing the guest
// closes the stream under the copy, and then that is the reason, not the
// closed stream, so callers can tell it apart (context.Canceled, ErrClosed).
func (c *Client) copyBroke(ctx context.Context, typ, path string, moved int64, err error) error {
	if ctx.Err() != nil {
		err = ctx.Err()
	} else if cerr := c.Err(); cerr != nil {
		err = cerr
	}
	return fmt.Errorf("guestctl: %s %s: after %d bytes: %w", typ, path, moved, err)
}
