//go:build !linux

package procs

// NotDumpable does nothing outside Linux.
func NotDumpable() error { return nil }
