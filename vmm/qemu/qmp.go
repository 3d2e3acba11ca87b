package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// qmp is a client of QEMU's machine protocol (QMP) on a connected Unix
// socket: one command at a time, events skipped.
type qmp struct {
	mu   sync.Mutex
	conn *net.UnixConn
	r    *bufio.Reader
}

// maxQMPLine bounds one QMP message; ours are small.
const maxQMPLine = 1 << 20

// newQMP reads QEMU's greeting and leaves negotiation mode, bounded by ctx.
func newQMP(ctx context.Context, conn *net.UnixConn) (*qmp, error) {
	q := &qmp{conn: conn, r: bufio.NewReaderSize(conn, 4096)}
	stop := q.bound(ctx)
	defer stop()
	var greeting struct {
		QMP *json.RawMessage `json:"QMP"`
	}
	line, err := q.readLine()
	if err != nil {
		return nil, fmt.Errorf("qemu: reading the QMP greeting: %w", err)
	}
	if err := json.Unmarshal(line, &greeting); err != nil || greeting.QMP == nil {
		return nil, fmt.Errorf("qemu: the monitor did not greet with QMP: %q", line)
	}
	if _, err := q.exec("qmp_capabilities", nil, nil); err != nil {
		return nil, err
	}
	return q, nil
}

// bound makes blocked reads and writes end when ctx does.
func (q *qmp) bound(ctx context.Context) (stop func()) {
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetDeadline(dl)
	}
	after := context.AfterFunc(ctx, func() { q.conn.SetDeadline(time.Unix(1, 0)) })
	return func() {
		after()
		q.conn.SetDeadline(time.Time{})
	}
}

// QMPError is an error QEMU answered a command with.
type QMPError struct {
	Command, Class, Desc string
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("qemu: QMP %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Execute runs command with args (nil for none) and returns its "return"
// value. fd, when not nil, travels with the command (SCM_RIGHTS), for
// commands such as getfd.
func (q *qmp) Execute(ctx context.Context, command string, args any, fd *os.File) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	stop := q.bound(ctx)
	defer stop()
	return q.exec(command, args, fd)
}

func (q *qmp) exec(command string, args any, fd *os.File) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	msg, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	msg = append(msg, '\n')
	var oob []byte
	if fd != nil {
		oob = unix.UnixRights(int(fd.Fd()))
	}
	if _, _, err := q.conn.WriteMsgUnix(msg, oob, nil); err != nil {
		return nil, fmt.Errorf("qemu: sending QMP %s: %w", command, err)
	}
	for {
		line, err := q.readLine()
		if err != nil {
			return nil, fmt.Errorf("qemu: waiting for the answer to QMP %s: %w", command, err)
		}
		var resp struct {
			Event  string          `json:"event"`
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qemu: QMP %s: undecodable answer %q: %w", command, line, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, &QMPError{Command: command, Class: resp.Error.Class, Desc: resp.Error.Desc}
		case resp.Return != nil:
			return resp.Return, nil
		default:
			return nil, fmt.Errorf("qemu: QMP %s: answer with neither return nor error: %q", command, line)
		}
	}
}

func (q *qmp) readLine() ([]byte, error) {
	var line []byte
	for {
		part, isPrefix, err := q.r.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, part...)
		if len(line) > maxQMPLine {
			return nil, errors.New("QMP message over 1 MiB")
		}
		if !isPrefix {
			return line, nil
		}
	}
}

func (q *qmp) Close() error { return q.conn.Close() }
