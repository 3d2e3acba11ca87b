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
	hop, goHop, commit, commitP99 time.Duration
}

// measureFloor times a 200-byte line through `cat` over pipes (one process
// round trip: two wake-ups, no work on the far side), the same through
// linecat (a Go process moving it the way the gateway's processes move
// their messages), and a one-row ledger commit, each the median of n.
func measureFloor(dir, linecat string, n int) (floorFigures, error) {
	var f floorFigures
	var err error
	if f.hop, err = measureHop(exec.Command("cat"), n); err != nil {
		return f, fmt.Errorf("cat: %w", err)
	}
	if f.goHop, err = measureHop(exec.Command(linecat), n); err != nil {
		return f, fmt.Errorf("linecat: %w", err)
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
	slices.Sort(commits)
	f.commit, f.commitP99 = commits[len(commits)/2], commits[len(commits)*99/100]
	return f, nil
}

// measureHop is the median round trip of a 200-byte line through cmd.
func measureHop(cmd *exec.Cmd, n int) (time.Duration, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	br := bufio.NewReader(stdout)
	line := []byte(strings.Repeat("x", 199) + "\n")
	hops := make([]time.Duration, 0, n)
	for i := range n + 50 {
		t := time.Now()
		if _, err := stdin.Write(line); err != nil {
			return 0, err
		}
		if _, err := br.ReadSlice('\n'); err != nil {
			return 0, err
		}
		if i >= 50 {
			hops = append(hops, time.Since(t))
		}
	}
	slices.Sort(hops)
	return hops[len(hops)/2], nil
}

func printFloor(f floorFigures) {
	fmt.Printf("Floor on this machine for the added p50 (target ≤ 150µs), before any gateway work:\n")
	fmt.Printf("  one process round trip, 200 B over pipes: through cat p50 %s, through a Go process (linecat, our I/O path) p50 %s\n", us(f.hop), us(f.goHop))
	fmt.Printf("  the gateway path adds 3 Go processes (relay, endpoint, aggregator): %s\n", us(3*f.goHop))
	fmt.Printf("  one-row ledger commit (must finish before the answer leaves) p50 %s (p99 %s)\n", us(f.commit), us(f.commitP99))
	fmt.Printf("  sum: %s (back to back; a process woken after an idle gap costs more: the \"3 hops\" tables above time that under each level's load)\n", us(3*f.goHop+f.commit))
}
