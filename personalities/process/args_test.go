package process

import (
	"reflect"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/vmhost"
)

// TestArgsParseBack: the argv Launch renders from a ProcessConfig parses
// back into the same configuration, its VM configuration whole: sizes,
// a disk of 0 (none) apart from an unset one, the environment (values
// with '=', ';' and spaces) and published ports.
func TestArgsParseBack(t *testing.T) {
	for _, want := range []vmhost.ProcessConfig{
		{SessionDir: "/s", Socket: "/s/p.sock", Name: "capsem", VMConfig: api.VMConfig{CPUs: 2, RAMMB: 1024, DiskGB: new(8)}},
		{SessionDir: "/s", Socket: "/s/p.sock", Name: "ramonly", VMConfig: api.VMConfig{Base: api.BaseMinimal, DiskGB: new(0)}},
		{SessionDir: "/s", Socket: "/s/p.sock", Name: "web", ID: "vm-0123456789ab", RootImage: "/images/root.erofs", VMConfig: api.VMConfig{
			CPUs: 1, RAMMB: 512, NetMTU: 1500, NoAutodetect: true, Base: api.BaseFull, Workspace: "/home/u/project", WorkspaceMiB: 64,
			Config: "/home/u/vm.toml", Env: map[string]string{"A": "1", "B": "x=y; z", "EMPTY": ""},
			Ports: []api.PortMapping{{Address: "127.0.0.1", Host: 8080, Guest: 3000}, {Address: "::1", Host: 9090, Guest: 80}, {Address: "0.0.0.0", Host: 1, Guest: 65535}}}},
	} {
		var got Cmd
		parser, err := kong.New(&got)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parser.Parse(want.Args()); err != nil {
			t.Fatalf("%q: %v", want.Args(), err)
		}
		if !reflect.DeepEqual(got.ProcessConfig, want) {
			t.Errorf("%q parsed to\n%+v, want\n%+v", want.Args(), got.ProcessConfig, want)
		}
	}
}
