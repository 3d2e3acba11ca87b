// Package version holds the build version, set at link time:
// -ldflags "-X github.com/capsem/capsem/core/version.Version=..."
package version

// Version of this capsem build.
var Version = "0.1.0-dev"
