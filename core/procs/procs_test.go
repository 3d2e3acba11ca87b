package procs

import (
	"math"
	"runtime"
	"runtime/debug"
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

func TestTuneGCUnlessTheEnvironmentSaysOtherwise(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	TuneGC()
	if got := debug.SetGCPercent(100); got != helperGCPercent {
		t.Errorf("GC percent %d, want %d", got, helperGCPercent)
	}
	if got := debug.SetMemoryLimit(-1); got != helperMemoryLimit {
		t.Errorf("memory limit %d, want %d", got, helperMemoryLimit)
	}

	debug.SetGCPercent(77)
	debug.SetMemoryLimit(1 << 40)
	t.Setenv("GOGC", "77")
	t.Setenv("GOMEMLIMIT", "1TiB")
	TuneGC()
	if got := debug.SetGCPercent(77); got != 77 {
		t.Errorf("GOGC in the environment overridden: %d", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 1<<40 {
		t.Errorf("GOMEMLIMIT in the environment overridden: %d", got)
	}
}
