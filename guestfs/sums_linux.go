package guestfs

import "syscall"

func changeTimeNS(st *syscall.Stat_t) (int64, bool) {
	return st.Ctim.Sec*1e9 + st.Ctim.Nsec, true
}
