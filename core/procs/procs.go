// Package procs sizes the Go scheduler of capsem's helper processes and
// makes their stdio pollable. The relay, the aggregator, the builtin server
// and the standalone gateway share the host with QEMU's
// vCPUs, the endpoint and the MCP servers; each Go process with a P per CPU
// spins and wakes threads on every message, which on a small host costs more
// CPU than the work itself. Fewer Ps measured up to 1.5× the calls/s at
// concurrency 16–64 on a 2-core host.
package procs

import (
	"os"
	"runtime"
	"runtime/debug"
)

// Limit lowers GOMAXPROCS to n unless the environment sets GOMAXPROCS.
func Limit(n int) {
	if os.Getenv("GOMAXPROCS") != "" || n < 1 || n >= runtime.GOMAXPROCS(0) {
		return
	}
	runtime.GOMAXPROCS(n)
}

// Helper is the P count for a helper that fans out work (the aggregator,
// the builtin server): a quarter of the CPUs, at least one.
func Helper() int { return max(1, runtime.NumCPU()/4) }

// Helpers collect garbage less often than Go's default (GOGC 100): the MCP
// SDK's JSON decoding allocates a 32 KiB buffer per value it unmarshals
// (about 128 KiB per tools/call), so at the default the aggregator spent a
// sixth of its time in the collector. The soft limit keeps a process with a
// large live heap from growing to five times it. GOGC and GOMEMLIMIT in the
// environment still win.
const (
	helperGCPercent   = 400
	helperMemoryLimit = 128 << 20
)

// TuneGC applies the helpers' collector settings.
func TuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(helperGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(helperMemoryLimit)
	}
}
