//go:build !linux && !darwin

package guestfs

import "syscall"

func changeTimeNS(*syscall.Stat_t) (int64, bool) { return 0, false }
