package builtintools

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/envvars"
)

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string
	}{
		{
			name: "defaults",
			env:  map[string]string{},
			want: Config{MaxBodyBytes: DefaultMaxBodyBytes, Timeout: DefaultTimeout, MaxRedirects: DefaultMaxRedirects},
		},
		{
			name: "all set",
			env: map[string]string{
				envvars.DomainAllow.Name():      " *.github.com, pypi.org ,,",
				envvars.DomainBlock.Name():      "evil.com",
				envvars.HTTPMaxBodyBytes.Name(): "1024",
				envvars.HTTPTimeout.Name():      "2.5",
				envvars.HTTPAllowPrivate.Name(): "true",
			},
			want: Config{
				Allow: []string{"*.github.com", "pypi.org"}, Block: []string{"evil.com"},
				MaxBodyBytes: 1024, Timeout: 2500 * time.Millisecond, MaxRedirects: DefaultMaxRedirects,
				AllowPrivateNetworks: true,
			},
		},
		{name: "allow private 1", env: map[string]string{envvars.HTTPAllowPrivate.Name(): "1"}, want: defaultsWith(Config{AllowPrivateNetworks: true})},
		{name: "allow private TRUE", env: map[string]string{envvars.HTTPAllowPrivate.Name(): " TRUE "}, want: defaultsWith(Config{AllowPrivateNetworks: true})},
		{name: "allow private 0", env: map[string]string{envvars.HTTPAllowPrivate.Name(): "0"}, want: defaultsWith(Config{})},
		{name: "allow private false", env: map[string]string{envvars.HTTPAllowPrivate.Name(): "false"}, want: defaultsWith(Config{})},
		{name: "allow private yes", env: map[string]string{envvars.HTTPAllowPrivate.Name(): "yes"}, wantErr: envvars.HTTPAllowPrivate.Name() + `="yes": must be 1, true, 0 or false`},
		{name: "allow private 2", env: map[string]string{envvars.HTTPAllowPrivate.Name(): "2"}, wantErr: envvars.HTTPAllowPrivate.Name() + `="2": must be 1, true, 0 or false`},
		{name: "bad allow pattern", env: map[string]string{envvars.DomainAllow.Name(): "good.com,*bad"}, wantErr: `allow list: domain pattern "*bad"`},
		{name: "url in block list", env: map[string]string{envvars.DomainBlock.Name(): "https://evil.com"}, wantErr: "not a URL"},
		{name: "body not a number", env: map[string]string{envvars.HTTPMaxBodyBytes.Name(): "10MB"}, wantErr: envvars.HTTPMaxBodyBytes.Name() + `="10MB": not a whole number`},
		{name: "body zero", env: map[string]string{envvars.HTTPMaxBodyBytes.Name(): "0"}, wantErr: "must be between 1 and"},
		{name: "body too large", env: map[string]string{envvars.HTTPMaxBodyBytes.Name(): "99999999999"}, wantErr: "must be between 1 and"},
		{name: "timeout not a number", env: map[string]string{envvars.HTTPTimeout.Name(): "30s"}, wantErr: envvars.HTTPTimeout.Name() + `="30s": not a number`},
		{name: "timeout negative", env: map[string]string{envvars.HTTPTimeout.Name(): "-1"}, wantErr: "must be more than 0"},
		{name: "timeout NaN", env: map[string]string{envvars.HTTPTimeout.Name(): "NaN"}, wantErr: "must be more than 0"},
		{name: "timeout too long", env: map[string]string{envvars.HTTPTimeout.Name(): "86400"}, wantErr: "at most 3600 seconds"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			got, err := ConfigFromEnv(func(key string) string { return test.env[key] })
			if test.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), test.wantErr) {
					t.Fatalf("ConfigFromEnv error = %v, want containing %q", err, test.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ConfigFromEnv: %v", err)
			}
			if !slices.Equal(got.Allow, test.want.Allow) || !slices.Equal(got.Block, test.want.Block) ||
				got.MaxBodyBytes != test.want.MaxBodyBytes || got.Timeout != test.want.Timeout || got.MaxRedirects != test.want.MaxRedirects ||
				got.AllowPrivateNetworks != test.want.AllowPrivateNetworks {
				t.Errorf("ConfigFromEnv = %+v, want %+v", got, test.want)
			}
		})
	}
}

// defaultsWith is cfg with the limits ConfigFromEnv fills in.
func defaultsWith(cfg Config) Config {
	return cfg.withDefaults()
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{MaxBodyBytes: -1}).Validate(); err == nil {
		t.Error("negative MaxBodyBytes: want an error")
	}
	if err := (Config{Timeout: -time.Second}).Validate(); err == nil {
		t.Error("negative Timeout: want an error")
	}
	if err := (Config{Block: []string{"a.*"}}).Validate(); err == nil {
		t.Error("bad pattern: want an error")
	}
	if err := (Config{Allow: []string{"*.ok.example"}}).Validate(); err != nil {
		t.Errorf("good config: %v", err)
	}
}
