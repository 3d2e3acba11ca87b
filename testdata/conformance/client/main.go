// Command client is the client under test in the MCP conformance suite's
// client scenarios (conformance client --command "client -capsem PATH"):
// capsem's MCP aggregator (capsem mcp-aggregator, sandboxed as a VM's
// gateway runs it), driven through core/aggclient as the gateway drives it,
// with the scenario's server (the URL the suite appends) as its one
// streamable HTTP server. It lists the catalog and calls every tool with
// arguments made from its input schema's required properties, as a guest's
// agent would through the gateway, and prints what it got. It exits 1 at
// the first failure, saying what failed on stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/capsem/capsem/core/aggclient"
	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/privsep"
)

// serverName is the name the scenario's server gets in the aggregator:
// its tools are serverName__<tool>.
const serverName = "conformance"

func main() {
	capsem := flag.String("capsem", "", "the capsem binary whose mcp-aggregator runs")
	flag.Parse()
	if *capsem == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: client -capsem PATH URL")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if err := run(ctx, *capsem, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "conformance client:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, capsem, url string) error {
	scratch, err := os.MkdirTemp("", "conformance-aggregator-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	spawn := func(ctx context.Context) (*exec.Cmd, error) {
		cmd, err := privsep.Command(ctx, privsep.Spec{Executable: capsem, Args: []string{"mcp-aggregator"}, Scratch: scratch})
		if err != nil {
			return nil, err
		}
		cmd.Stderr = os.Stderr
		cmd.WaitDelay = 2 * time.Second
		return cmd, nil
	}
	agg := aggclient.Start(ctx, spawn, []aggwire.ServerDef{{Name: serverName, URL: url, Enabled: true, ConnectTimeoutMS: 15000}}, log)
	defer agg.Close()

	// Listing waits for the server's first connect.
	tools, err := agg.Do(ctx, &aggwire.Request{Method: aggwire.MethodListTools})
	if err != nil {
		return fmt.Errorf("listing tools: %w", err)
	}
	if tools.Error != "" {
		return fmt.Errorf("listing tools: %s", tools.Error)
	}
	servers, err := agg.Do(ctx, &aggwire.Request{Method: aggwire.MethodListServers})
	if err != nil {
		return fmt.Errorf("listing servers: %w", err)
	}
	if len(servers.Servers) != 1 || !servers.Servers[0].Connected {
		return fmt.Errorf("the server did not connect: %+v", servers.Servers)
	}
	fmt.Printf("connected: %d tools\n", len(tools.Tools))
	for _, t := range tools.Tools {
		args, err := argumentsFor(t.InputSchema)
		if err != nil {
			return fmt.Errorf("tool %s: %w", t.Name, err)
		}
		resp, err := agg.Do(ctx, &aggwire.Request{Method: aggwire.MethodCallTool, Name: t.Name, Arguments: args})
		if err != nil {
			return fmt.Errorf("calling %s: %w", t.Name, err)
		}
		if resp.Error != "" {
			return fmt.Errorf("calling %s: %s (code %d)", t.Name, resp.Error, resp.Code)
		}
		var result struct {
			IsError bool `json:"isError"`
		}
		if err := json.Unmarshal(resp.Result, &result); err != nil {
			return fmt.Errorf("calling %s: the result %q: %w", t.Name, resp.Result, err)
		}
		fmt.Printf("%s %s: %s\n", t.Name, args, resp.Result)
		if result.IsError {
			return fmt.Errorf("calling %s: a tool error: %s", t.Name, resp.Result)
		}
	}
	return nil
}

// argumentsFor makes a tool's arguments from its input schema: each
// required property with a value of its type (1, "x", true, [], {}).
func argumentsFor(schema []byte) ([]byte, error) {
	var s struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if len(schema) > 0 {
		if err := json.Unmarshal(schema, &s); err != nil {
			return nil, fmt.Errorf("input schema %s: %w", schema, err)
		}
	}
	args := map[string]any{}
	for _, name := range s.Required {
		typ, _ := s.Properties[name].Type.(string)
		switch typ {
		case "number", "integer":
			args[name] = 1
		case "string", "":
			args[name] = "x"
		case "boolean":
			args[name] = true
		case "array":
			args[name] = []any{}
		case "object":
			args[name] = map[string]any{}
		default:
			return nil, errors.New("required property " + name + " has type " + typ)
		}
	}
	return json.Marshal(args)
}
