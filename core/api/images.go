package api

import (
	"time"
)

// Routes of images: what a fork makes of a VM, a template to create VMs
// from (CreateRequest.Image).
const (
	RouteImages = "/v1/images"         // GET: []Image
	RouteImage  = "/v1/images/{image}" // GET: Image; DELETE: 204 (refused while a VM uses it)
	// RouteVMFork makes an image of a running or stopped VM (POST
	// ForkRequest: Image); a running VM runs on.
	RouteVMFork = "/v1/vms/{vm}/fork"
	// RouteFork is the per-VM process's side of a running VM's fork:
	// POST ForkCopyRequest: ForkCopy.
	RouteFork = "/v1/fork"
)

// ImageFormat is the version of Image's form: an image of a newer one is
// listed with its problem and not used.
const ImageFormat = 1

// ForkRequest makes an image named Name of a VM. Image names share VM
// names' form and namespace: none may be a VM's.
type ForkRequest struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Memory keeps the VM's RAM and CPU state too (of a running or
	// suspended VM): every VM made from the image resumes with the
	// source's processes running where they were.
	Memory bool `json:"memory,omitempty"`
}

// MaxDescription bounds an image's description, in bytes.
const MaxDescription = 4096

// Image is a fork of a VM: its disk and workspace as they were, and the
// configuration VMs made from it start with.
type Image struct {
	Format      int         `json:"format"`
	Name        string      `json:"name"`
	Description string      `json:"description,omitempty"`
	Source      ImageSource `json:"source"`
	CreatedAt   time.Time   `json:"created_at"`
	// Base and RootImage are the source's root: VMs of the image boot
	// that very root image, or not at all (Problem says it is gone).
	Base      string `json:"base"`
	RootImage string `json:"root_image,omitempty"`
	// Memory: the image holds the source's RAM and CPU state (StateBytes
	// of it); its VMs resume from it rather than boot, with the source's
	// memory and CPUs.
	Memory     bool  `json:"memory,omitempty"`
	StateBytes int64 `json:"state_bytes,omitempty"`
	// Config is the source's configuration, less what belongs to the
	// source alone (its ports, its host workspace directory): the
	// defaults of a VM created from the image.
	Config VMConfig `json:"config"`
	// DiskBytes is the disk's size as the guest sees it; DiskAllocated
	// what its file takes on the host; WorkspaceBytes the workspace's
	// files. SizeBytes is what the image takes: the two together.
	DiskBytes      int64 `json:"disk_bytes"`
	DiskAllocated  int64 `json:"disk_allocated_bytes"`
	WorkspaceBytes int64 `json:"workspace_bytes"`
	SizeBytes      int64 `json:"size_bytes"`
	// ForkMS is the fork's duration; PausedMS how long a running
	// source was paused for it (a memory fork: suspended and resumed).
	ForkMS   int64 `json:"fork_ms"`
	PausedMS int64 `json:"paused_ms,omitempty"`
	// UsedBy names the VMs made from the image (their disks are layers
	// over its disk): it cannot be deleted while there are any.
	UsedBy []string `json:"used_by,omitempty"`
	// Problem says why no VM can be made from the image now.
	Problem string `json:"problem,omitempty"`
}

// ImageSource is the VM an image was forked from, as it was then.
type ImageSource struct {
	ID    string `json:"id"`
	Name  string `json:"name,omitempty"`
	State string `json:"state"`
}

// ForkCopyRequest asks a running VM's process to copy its disk and
// workspace into Dir (an empty directory under the images directory), the
// guest's filesystems synced and the VM paused meanwhile.
type ForkCopyRequest struct {
	Dir string `json:"dir"`
}

// ForkCopy is what the copy took.
type ForkCopy struct {
	// StateBytes is a memory fork's saved state (the service copies it).
	StateBytes     int64 `json:"state_bytes,omitempty"`
	DiskBytes      int64 `json:"disk_bytes"`
	DiskAllocated  int64 `json:"disk_allocated_bytes"`
	WorkspaceBytes int64 `json:"workspace_bytes"`
	SyncMS         int64 `json:"sync_ms"`
	PausedMS       int64 `json:"paused_ms"`
}

// RouteSuspend is the per-VM process's suspend (POST: SuspendResult; the
// VM then stops); RouteVMSuspend the service's (POST: VM, suspended).
const (
	RouteSuspend   = "/v1/suspend"
	RouteVMSuspend = "/v1/vms/{vm}/suspend"
)

// SuspendResult is what a suspend saved and how long it took.
type SuspendResult struct {
	StateBytes int64 `json:"state_bytes"`
	SuspendMS  int64 `json:"suspend_ms"`
}

// ResumeRequest resumes a stopped or suspended VM; Boot discards a
// suspended VM's saved state and boots its disk instead.
type ResumeRequest struct {
	Boot bool `json:"boot,omitempty"`
}
