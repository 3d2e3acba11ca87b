// Command capsem is the single Capsem executable; it dispatches to a personality
// by argv[0] (symlink name) or by its first argument.
package main

import (
	"os"

	"github.com/capsem/capsem/personalities"
)

func main() { os.Exit(personalities.Main(os.Args)) }
