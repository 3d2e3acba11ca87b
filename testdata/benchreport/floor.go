package main

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capsem/capsem/core/ledger"
)

// floorFigures measures what the gateway path cannot avoid on this machine,
// before any of its own work: the round trips into the extra processes the
// design puts on the path (relay, endpoint, aggregator), and the ledger
// commit that must finish before each answer leaves. They bound how close
// the added p50 can come to its target here.
type floorFigures struct {
	hop, commit, commitP99 time.Duration
}

// measureFloor times a 200-byte line through `cat` over pipes (one process
// round trip: two wake-ups, no work on the far side) and a one-row ledger
// commit, each the median of n.
func measureFloor(dir string, n int) (floorFigures, error) {
	var f floorFigures
	cmd := exec.Command("cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return f, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return f, err
	}
	if err := cmd.Start(); err != nil {
		return f, fmt.Errorf("starting cat: %w", err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	br := bufio.NewReader(stdout)
	line := []byte(strings.Repeat("x", 199) + "\n")
	hops := make([]time.Duration, 0, n)
	for i := range n + 50 {
		t := time.Now()
		if _, err := stdin.Write(line); err != nil {
			return f, err
		}
		if _, err := br.ReadSlice('\n'); err != nil {
			return f, err
		}
		if i >= 50 {
			hops = append(hops, time.Since(t))
		}
	}

	ctx := context.Background()
	l, err := ledger.Open(ctx, filepath.Join(dir, "floor.db"), ledger.Options{})
	if err != nil {
		return f, err
	}
	defer l.Close()
	commits := make([]time.Duration, 0, n)
	for i := range n + 50 {
		row := &ledger.MCPCall{ServerName: "echo", Method: "tools/call", ToolName: "echo__echo", RequestID: fmt.Sprint(i),
			RequestPreview: `{"name":"echo__echo","arguments":{"text":"ping"}}`, ResponsePreview: `{"content":[{"type":"text","text":"ping"}]}`,
			Decision: ledger.DecisionAllowed, ProcessName: "bench", Transport: "frame"}
		t := time.Now()
		if err := l.Write(ctx, row); err != nil {
			return f, err
		}
		if i >= 50 {
			commits = append(commits, time.Since(t))
		}
	}
	slices.Sort(hops)
	slices.Sort(commits)
	f.hop, f.commit, f.commitP99 = hops[len(hops)/2], commits[len(commits)/2], commits[len(commits)*99/100]
	return f, nil
}

func printFloor(f floorFigures) {
	fmt.Printf("Floor on this machine for the added p50 (target ≤ 150µs), before any gateway work:\n")
	fmt.Printf("  one process round trip (200 B through cat over pipes) p50 %s; the gateway path adds 3 (relay, endpoint, aggregator): %s\n",
		us(f.hop), us(3*f.hop))
	fmt.Printf("  one-row ledger commit (must finish before the answer leaves) p50 %s (p99 %s)\n", us(f.commit), us(f.commitP99))
	fmt.Printf("  sum: %s\n", us(3*f.hop+f.commit))
}
