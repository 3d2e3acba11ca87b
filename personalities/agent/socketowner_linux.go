package agent

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/guestwire"
)

// maxOwnerScan bounds the processes looked at for one socket's owner.
const maxOwnerScan = 4096

// socketOwner finds the process holding the guest's TCP socket q names
// (local port, destination), under procRoot (/proc): the socket's inode
// from net/tcp, then the process with a descriptor on it, then its trace
// id (envvars.TraceID, inherited from the exec that started it) and
// name. A socket no process holds any more is PID 0, not an error.
func socketOwner(q *guestwire.SocketQuery, procRoot string) (*guestwire.SocketOwner, error) {
	remote, err := netip.ParseAddr(q.RemoteIP)
	if err != nil || !remote.Is4() {
		return nil, guestwire.Errorf(guestwire.CodeInvalid, "socket_owner: remote_ip %q is not an IPv4 address", q.RemoteIP)
	}
	inode, err := tcpInode(filepath.Join(procRoot, "net", "tcp"), q.LocalPort, netip.AddrPortFrom(remote, q.RemotePort))
	if err != nil || inode == "" {
		return &guestwire.SocketOwner{}, err
	}
	want := "socket:[" + inode + "]"
	procs, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	scanned := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		if scanned++; scanned > maxOwnerScan {
			break
		}
		dir := filepath.Join(procRoot, p.Name())
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && link == want {
				return ownerOf(pid, dir), nil
			}
		}
	}
	return &guestwire.SocketOwner{}, nil
}

func ownerOf(pid int, dir string) *guestwire.SocketOwner {
	o := &guestwire.SocketOwner{PID: pid}
	if comm, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		o.Process = strings.TrimSpace(string(comm))
	}
	if env, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil {
		for _, kv := range bytes.Split(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte(envvars.TraceID.Name()+"=")); ok {
				o.TraceID = string(v)
			}
		}
	}
	return o
}

// tcpInode finds the inode of the IPv4 TCP socket from localPort to remote
// in a /proc/net/tcp table ("" when there is none).
func tcpInode(path string, localPort uint16, remote netip.AddrPort) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		_, lport, err := parseProcAddr(fields[1])
		if err != nil || lport != localPort {
			continue
		}
		raddr, rport, err := parseProcAddr(fields[2])
		if err != nil || netip.AddrPortFrom(raddr, rport) != remote {
			continue
		}
		if fields[9] != "0" {
			return fields[9], nil
		}
	}
	return "", sc.Err()
}

// parseProcAddr reads "0100007F:0050": an IPv4 address in the kernel's
// byte order (little-endian on the guests capsem runs) and a hex port.
func parseProcAddr(s string) (netip.Addr, uint16, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok || len(a) != 8 {
		return netip.Addr{}, 0, fmt.Errorf("not an IPv4 address:port: %q", s)
	}
	b, err := hex.DecodeString(a)
	if err != nil {
		return netip.Addr{}, 0, err
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.Addr{}, 0, err
	}
	return netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}), uint16(port), nil
}
