package procs

import (
	"runtime"
	"testing"
)

func TestLimit(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	runtime.GOMAXPROCS(4)
	t.Setenv("GOMAXPROCS", "")
	Limit(1)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS %d after Limit(1)", got)
	}
	Limit(3) // never raises
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("Limit raised GOMAXPROCS to %d", got)
	}
	runtime.GOMAXPROCS(4)
	t.Setenv("GOMAXPROCS", "4")
	Limit(1) // an explicit setting wins
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Fatalf("Limit overrode an explicit GOMAXPROCS: %d", got)
	}
	if Helper() < 1 {
		t.Fatal("Helper must be at least 1")
	}
}
