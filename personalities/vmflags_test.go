//go:build !capsem_guest

package personalities

import (
	"reflect"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/capsem/capsem/core/api"
)

// TestVMFlags: capsem create and capsem run spell the VM's settings alike
// (api.VMConfig's flags) and parse them into the same configuration: the
// environment with values holding '=' and ';', a disk of 0, ports with and
// without an address; a bad port is refused naming it.
func TestVMFlags(t *testing.T) {
	flags := []string{"--cpus", "1", "--ram-mb", "512", "--disk-gb", "0", "--base", "minimal", "--workspace-mib", "64", "--no-network",
		"-e", "A=1", "--env", "B=x=y;z", "--net-mtu", "1500", "--no-autodetect"}
	want := api.VMConfig{CPUs: 1, RAMMB: 512, DiskGB: new(0), Base: api.BaseMinimal, WorkspaceMiB: 64, NoNetwork: true, NoAutodetect: true,
		NetMTU: 1500, Env: map[string]string{"A": "1", "B": "x=y;z"}}
	parse := func(args ...string) (*CLI, error) {
		var cli CLI
		p, err := kong.New(&cli, kong.Exit(func(int) { t.Fatalf("kong exited on %q", args) }))
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Parse(args)
		return &cli, err
	}
	cli, err := parse(append([]string{"create", "dev"}, flags...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cli.Create.VMConfig, want) {
		t.Errorf("create: %+v, want %+v", cli.Create.VMConfig, want)
	}
	cli, err = parse(append(append([]string{"run"}, flags...), "--", "true")...)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cli.Run.VMConfig, want) {
		t.Errorf("run: %+v, want %+v", cli.Run.VMConfig, want)
	}
	cli, err = parse("create", "-p", "8080:3000", "--publish", "[::1]:9090:80")
	if err != nil {
		t.Fatal(err)
	}
	if want := []api.PortMapping{{Address: "127.0.0.1", Host: 8080, Guest: 3000}, {Address: "::1", Host: 9090, Guest: 80}}; !reflect.DeepEqual(cli.Create.Ports, want) {
		t.Errorf("ports %+v, want %+v", cli.Create.Ports, want)
	}
	if _, err := parse("create", "-p", "8080:0"); err == nil || !strings.Contains(err.Error(), "--publish: port 8080:0: guest port 0") {
		t.Errorf("a bad port: %v", err)
	}
}
