// Package netpolicy decides where a name, an address and a port may go: the
// guest network and the builtin HTTP tools both ask it.
//
// The builtin tools use Lists (one allow and one block list). The guest
// network uses Policy, the [net] table of every configuration file merged so
// that a lower file (user.toml) can only tighten a higher one (corp.toml).
// Both compare hosts in the single spelling NormalizeHost gives, and both
// classify addresses with AddressClass.
package netpolicy
