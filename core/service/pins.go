package service

import (
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/guestfs"
)

// pinHolder is the service's name among the root image store's pins.
const pinHolder = "service"

// pinRoots pins, in the root image store, the root images this service's
// VMs and images use (vmrecord.Record.RootImage, api.Image.RootImage): a
// persistent VM boots from the root image it was made with, and an image's
// VMs from the image's, whatever the store's refs name since, so pruning
// after a rebuild must keep them (guestfs.SetPins). It runs at start and
// after every change of the set: a VM made, given an image's root or
// removed, an image published or removed. A failure is logged: the next
// change tries again.
func (s *Service) pinRoots() {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	want := map[string][]string{}
	// The service's own asset directory always: pins of VMs removed while
	// no service ran go at its start.
	if dir, err := paths.AssetsDir(); err == nil {
		want[dir] = nil
	}
	for dir := range s.pinned {
		want[dir] = nil
	}
	add := func(root string) {
		if dir, _, ok := guestfs.StoreEntryOf(root); ok {
			want[dir] = append(want[dir], root)
		}
	}
	s.mu.Lock()
	for _, v := range s.vms {
		add(v.rec.RootImage)
	}
	s.mu.Unlock()
	imgs, _ := s.images.List()
	for _, img := range imgs {
		add(img.RootImage)
	}
	pinned := map[string]bool{}
	for dir, roots := range want {
		if err := guestfs.SetPins(dir, pinHolder, roots); err != nil {
			s.log.Warn("pinning the root images in use", "dir", dir, "err", err)
			pinned[dir] = true // try again at the next change
			continue
		}
		if len(roots) > 0 {
			pinned[dir] = true
		}
	}
	s.pinned = pinned
}
