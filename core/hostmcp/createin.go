package hostmcp

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/capsem/capsem/core/api"
)

// CreateIn is capsem_create's arguments: a name, an image, and the VM's
// configuration, api.VMConfig, each setting under the camelCase name its
// declaration gives the MCP wire. Its schema and its decoding are derived
// from that declaration, so a setting added there is an argument here.
type CreateIn struct {
	Name  string
	Image string
	api.VMConfig
}

// configArg is one setting of api.VMConfig as capsem_create takes it.
type configArg struct {
	mcp, json, description string
	typ                    reflect.Type
	enum                   []string
}

// createArgs are capsem_create's arguments beyond the VM's configuration.
var createArgs = map[string]string{
	"name":  "A name makes the VM persistent: capsem_stop keeps its disk and ledger for capsem_resume (lower-case letters, digits, '-').",
	"image": "An image made by capsem_fork to boot from: its disk, workspace and settings (settings given here win; its base and disk size are its own). Default: a fresh VM.",
}

// vmConfigArgs lists api.VMConfig's settings under their MCP names.
func vmConfigArgs() []configArg {
	var out []configArg
	t := reflect.TypeFor[api.VMConfig]()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("kong") == "-" {
			continue
		}
		jsonName, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		a := configArg{mcp: f.Tag.Get("mcp"), json: jsonName, description: f.Tag.Get("mcphelp"), typ: f.Type}
		if a.mcp == "" {
			a.mcp = camelCase(jsonName)
		}
		if a.description == "" {
			a.description = f.Tag.Get("help")
		}
		for _, e := range strings.Split(f.Tag.Get("enum"), ",") {
			if e != "" {
				a.enum = append(a.enum, e)
			}
		}
		out = append(out, a)
	}
	return out
}

// createInSchema is capsem_create's input schema.
func createInSchema() (*jsonschema.Schema, error) {
	s := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{}, AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}}}
	for name, about := range createArgs {
		s.Properties[name] = &jsonschema.Schema{Type: "string", Description: about}
	}
	for _, a := range vmConfigArgs() {
		p, err := argSchema(a.typ)
		if err != nil {
			return nil, fmt.Errorf("capsem_create argument %s: %w", a.mcp, err)
		}
		p.Description = a.description
		for _, e := range a.enum {
			p.Enum = append(p.Enum, e)
		}
		s.Properties[a.mcp] = p
	}
	return s, nil
}

// argSchema is the schema of one setting's type.
func argSchema(t reflect.Type) (*jsonschema.Schema, error) {
	switch {
	case t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Int, t.Kind() == reflect.Int:
		return &jsonschema.Schema{Type: "integer"}, nil
	case t.Kind() == reflect.String:
		return &jsonschema.Schema{Type: "string"}, nil
	case t.Kind() == reflect.Bool:
		return &jsonschema.Schema{Type: "boolean"}, nil
	case t == reflect.TypeFor[map[string]string]():
		return &jsonschema.Schema{Type: "object", AdditionalProperties: &jsonschema.Schema{Type: "string"}}, nil
	case t.Kind() == reflect.Slice:
		items, err := jsonschema.ForType(t.Elem(), &jsonschema.ForOptions{})
		if err != nil {
			return nil, err
		}
		return &jsonschema.Schema{Type: "array", Items: items}, nil
	}
	return nil, fmt.Errorf("no schema for %s", t)
}

// UnmarshalJSON reads capsem_create's arguments: its own, and the VM's
// configuration under the MCP names, decoded as the service API's JSON.
func (in *CreateIn) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("arguments: %w", err)
	}
	byMCP := map[string]configArg{}
	for _, a := range vmConfigArgs() {
		byMCP[a.mcp] = a
	}
	config := map[string]json.RawMessage{}
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		var err error
		switch a, ok := byMCP[k]; {
		case k == "name":
			err = json.Unmarshal(raw[k], &in.Name)
		case k == "image":
			err = json.Unmarshal(raw[k], &in.Image)
		case ok:
			config[a.json] = raw[k]
		default:
			err = fmt.Errorf("unknown argument")
		}
		if err != nil {
			return fmt.Errorf("argument %s: %w", k, err)
		}
	}
	b, err := json.Marshal(config)
	if err == nil {
		err = json.Unmarshal(b, &in.VMConfig)
	}
	if err != nil {
		return fmt.Errorf("arguments: %w", err)
	}
	return nil
}

// camelCase is a snake_case name in camelCase: ram_mb → ramMb.
func camelCase(s string) string {
	parts := strings.Split(s, "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}
