package service

import "github.com/capsem/capsem/core/version"

func versionString() string { return version.Version }
