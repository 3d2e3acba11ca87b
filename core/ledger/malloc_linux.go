//go:build cgo && linux

package ledger

/*
#include <malloc.h>
*/
import "C"

// returnLargeAllocations makes the C allocator serve blocks of 1 MiB and
// more with mappings of their own, unmapped when freed. By default glibc
// raises that threshold as large blocks are freed and keeps later ones in
// per-thread arenas, so the process would hold SQLite's peak once for
// each thread a query ran on, past QueryLimits.MaxMemoryBytes.
func returnLargeAllocations() { C.mallopt(C.M_MMAP_THRESHOLD, 1<<20) }
