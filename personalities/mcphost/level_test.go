package mcphost

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/capsem/capsem/core/logs"
)

func TestLevelOf(t *testing.T) {
	for _, level := range []string{"debug", "info", "warn", "error"} {
		got := levelOf(context.Background(), logs.New(io.Discard, level))
		var want slog.Level
		want.UnmarshalText([]byte(level))
		if got != want.String() {
			t.Errorf("a logger at %s reads as %s", level, got)
		}
	}
}
