package service

import (
	"slices"
	"strings"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/vmrecord"
)

// verb is one of the service's lifecycle operations on a VM.
type verb string

const (
	verbStop    verb = "stop"
	verbResume  verb = "resume"
	verbPersist verb = "persist"
	verbFork    verb = "fork"
	verbSuspend verb = "suspend"
)

// verbAccepts declares, once, the states each verb acts on; guard checks
// a VM against it. (Delete takes a VM in any state.)
var verbAccepts = map[verb][]api.VMState{
	verbStop:    {api.StateRunning},
	verbResume:  {api.StateStopped, api.StateDefunct, api.StateSuspended},
	verbSuspend: {api.StateRunning},
	verbPersist: {api.StateRunning},
	// A defunct VM's disk is as its process's death left it: a fork
	// would copy that as a template. Resume or delete it.
	// A suspended VM's disk is as its paused QEMU flushed it.
	verbFork: {api.StateRunning, api.StateStopped, api.StateSuspended},
}

// guard refuses vb on a VM whose state it does not accept, naming both.
func guard(vb verb, r *vmrecord.Record) error {
	ok := verbAccepts[vb]
	if slices.Contains(ok, r.State) {
		return nil
	}
	names := make([]string, len(ok))
	for i, s := range ok {
		names[i] = string(s)
	}
	return conflict("VM %s is %s: %s takes a VM that is %s", r.Label(), r.State, vb, strings.Join(names, " or "))
}
