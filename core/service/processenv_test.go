package service

import (
	"slices"
	"strings"
	"testing"
)

// TestProcessEnv: a per-VM process gets the passed-on capsem variables
// (core/envvars), the basics, the credentials' sources it is given and the
// options' additions, and nothing else of the service's environment.
func TestProcessEnv(t *testing.T) {
	for k, v := range map[string]string{
		"CAPSEM_HOME": "/h", "CAPSEM_RUN_DIR": "/r", "CAPSEM_UDS_PATH": "/r/s.sock", "CAPSEM_CACHE_DIR": "/c",
		"CAPSEM_CORP_CONFIG": "/corp.toml", "CAPSEM_ACCEL": "tcg", "CAPSEM_BOOT_STATE": "off", "CAPSEM_LOG_LEVEL": "debug",
		"CAPSEM_TCG_CACHE_MIB": "64", "CAPSEM_NO_AUTODETECT": "1", "CAPSEM_MCP_INFLIGHT": "3", "CAPSEM_TEST_BIN": "/b",
		"LC_ALL": "C", "SECRET_TOKEN": "s", "OTHER_TOKEN": "o", "PATH": "/bin",
	} {
		t.Setenv(k, v)
	}
	s := &Service{o: Options{ProcessEnv: []string{"EXTRA=1"}}}
	got := s.processEnv("SECRET_TOKEN")
	for _, want := range []string{"CAPSEM_HOME=/h", "CAPSEM_RUN_DIR=/r", "CAPSEM_UDS_PATH=/r/s.sock", "CAPSEM_CACHE_DIR=/c",
		"CAPSEM_CORP_CONFIG=/corp.toml", "CAPSEM_ACCEL=tcg", "CAPSEM_BOOT_STATE=off", "CAPSEM_LOG_LEVEL=debug",
		"LC_ALL=C", "SECRET_TOKEN=s", "PATH=/bin", "EXTRA=1"} {
		if !slices.Contains(got, want) {
			t.Errorf("processEnv lacks %s: %q", want, got)
		}
	}
	for _, kv := range got {
		for _, not := range []string{"CAPSEM_TCG_CACHE_MIB=", "CAPSEM_NO_AUTODETECT=", "CAPSEM_MCP_INFLIGHT=", "CAPSEM_TEST_BIN=", "OTHER_TOKEN="} {
			if strings.HasPrefix(kv, not) {
				t.Errorf("processEnv passes %s on", kv)
			}
		}
	}
	if got[len(got)-1] != "EXTRA=1" {
		t.Errorf("the options' additions come last (they win): %q", got)
	}
}
