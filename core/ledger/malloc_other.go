//go:build cgo && !linux

package ledger

// returnLargeAllocations: other C allocators give large blocks back.
func returnLargeAllocations() {}
