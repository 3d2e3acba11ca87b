package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestVMConfigCheck: every setting out of bounds is refused by its JSON
// name with what it may be; unset settings check as their defaults.
func TestVMConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    VMConfig
		want string // "" : accepted
	}{
		{"unset: the defaults", VMConfig{}, ""},
		{"minimal from RAM", VMConfig{Base: BaseMinimal, DiskGB: new(0)}, ""},
		{"too many CPUs", VMConfig{CPUs: 65}, "cpus 65: want 1 to 64"},
		{"negative CPUs", VMConfig{CPUs: -1}, "cpus -1"},
		{"too little memory", VMConfig{RAMMB: 16}, "ram_mb 16 (guest memory in MB): want 128 to"},
		{"too much memory", VMConfig{RAMMB: MaxRAMMB + 1}, "ram_mb 65537"},
		{"negative disk", VMConfig{DiskGB: new(-1)}, "disk_gb -1 (disk size in GB): want 0 (no disk) to 4096"},
		{"disk past the bound", VMConfig{DiskGB: new(4097)}, "disk_gb 4097"},
		{"full root from RAM", VMConfig{DiskGB: new(0)}, `base "full" needs a disk`},
		{"unknown base", VMConfig{Base: "ubuntu"}, `base "ubuntu": want "full"`},
		{"negative workspace bound", VMConfig{WorkspaceMiB: -1}, "workspace_mib -1"},
		{"MTU too small", VMConfig{NetMTU: 576}, "net_mtu 576: want 0 (the default) or 1280 to 65520"},
		{"ports without a network", VMConfig{NoNetwork: true, Ports: []PortMapping{{Host: 8080, Guest: 80}}}, "ports 127.0.0.1:8080:80: the VM has no network"},
		{"relative workspace", VMConfig{Workspace: "project"}, `workspace "project": want an absolute path`},
		{"relative config", VMConfig{Config: "vm.toml"}, `config "vm.toml": want an absolute path`},
		{"env name with =", VMConfig{Env: map[string]string{"A=B": "1"}}, `env "A=B"`},
		{"env value with NUL", VMConfig{Env: map[string]string{"A": "x\x00y"}}, `env "A"`},
		{"port twice", VMConfig{Ports: []PortMapping{{Host: 8080, Guest: 80}, {Address: "127.0.0.1", Host: 8080, Guest: 81}}}, "published twice"},
		{"a newer capsem's", VMConfig{Version: VMConfigVersion + 1}, "config_version 2: this capsem reads up to 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestVMConfigDefaults: WithDefaults fills what is unset, keeps what is
// set (a disk of 0 included), marks the version, and shares no map or
// slice with the original.
func TestVMConfigDefaults(t *testing.T) {
	env := map[string]string{"A": "1"}
	ports := []PortMapping{{Host: 8080, Guest: 80}}
	d := VMConfig{RAMMB: 512, DiskGB: new(0), Base: BaseMinimal, Env: env, Ports: ports}.WithDefaults()
	want := VMConfig{Version: VMConfigVersion, CPUs: DefaultCPUs, RAMMB: 512, DiskGB: new(0), Base: BaseMinimal, WorkspaceMiB: DefaultWorkspaceMiB,
		Env: map[string]string{"A": "1"}, Ports: []PortMapping{{Address: DefaultPortAddress, Host: 8080, Guest: 80}}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("got %+v, want %+v", d, want)
	}
	d.Env["A"], d.Ports[0].Host = "2", 1
	if env["A"] != "1" || ports[0].Host != 8080 {
		t.Fatal("WithDefaults shares the original's map or slice")
	}
	if u := (VMConfig{}).WithDefaults(); *u.DiskGB != DefaultDiskGB || u.Base != BaseFull || u.Disk() != DefaultDiskGB {
		t.Fatalf("unset: %+v", u)
	}
}

// TestCreateRequestJSON: a create request's JSON is the VM configuration's
// names flat beside name and image, as the API has always taken them; a
// port given in any other form than its object is refused, as is a field
// a port does not have.
func TestCreateRequestJSON(t *testing.T) {
	var req CreateRequest
	body := `{"name":"dev","ram_mb":512,"cpus":1,"disk_gb":0,"base":"minimal","env":{"A":"1"},"ports":[{"host":8080,"guest":80}]}`
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	want := CreateRequest{Name: "dev", VMConfig: VMConfig{RAMMB: 512, CPUs: 1, DiskGB: new(0), Base: BaseMinimal, Env: map[string]string{"A": "1"},
		Ports: []PortMapping{{Host: 8080, Guest: 80}}}}
	if !reflect.DeepEqual(req, want) {
		t.Fatalf("got %+v, want %+v", req, want)
	}
	for _, bad := range []string{`{"ports":["8080:80"]}`, `{"ports":[{"host":8080,"guest":80,"proto":"udp"}]}`} {
		if err := json.Unmarshal([]byte(bad), &req); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
