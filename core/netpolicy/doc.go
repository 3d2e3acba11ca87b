// Package netpolicy decides where a name, an address and a port may go: the
// guest network and the builtin HTTP tools both ask it.
package netpolicy
