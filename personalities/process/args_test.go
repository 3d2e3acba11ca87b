package process

import (
	"reflect"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/capsem/capsem/core/vmhost"
)

// TestArgsParseBack: the argv Launch renders from a ProcessConfig parses
// back into the same configuration, lists (published ports) included.
func TestArgsParseBack(t *testing.T) {
	for _, want := range []vmhost.ProcessConfig{
		{SessionDir: "/s", Socket: "/s/p.sock", Name: "capsem", CPUs: 2, RAMMB: 1024, DiskGB: 8},
		{SessionDir: "/s", Socket: "/s/p.sock", Name: "web", CPUs: 1, RAMMB: 512, NetMTU: 1500, NoAutodetect: true,
			Publish: []string{"127.0.0.1:8080:3000", "[::1]:9090:80", "0.0.0.0:1:65535"}},
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
