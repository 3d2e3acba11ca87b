// Package guestfs builds the guest boot assets (kernel, initramfs) from
// Debian packages and the capsem binary itself, and caches them.
//
// Inputs: the generic kernel (linux-image-amd64's dependency, today
// linux-image-6.1.0-NN-amd64) and busybox-static, fetched with apt-get
// download and unpacked with dpkg-deb -x (never installed), plus the
// CGO-free guest binary that becomes /init. Outputs, under Options.Dir:
//
//	<hash>/vmlinux          uncompressed ELF kernel with the PVH note (QEMU -kernel boots it directly)
//	<hash>/vmlinuz          Debian's bzImage, the fallback
//	<hash>/initramfs.cpio   uncompressed newc: /init, busybox, modules, /lib/modules/load-order
//	<hash>/manifest.json    inputs and the sha256 of each file, re-checked by Assets.Verify
//	kernels/<key>/          the kernel stage: vmlinux, vmlinuz and the chosen modules, reused
//	                        when only the guest binary changed
//	debs/                   the downloaded .debs, so rebuilds do not fetch 70 MB again
//	apt-resolution.json     apt's answer, reused while its package lists are unchanged
//	.lock                   flock held while building
//
// Root images (root.go) are built beside them from a recipe
// (recipes/*.toml) and are content-addressed:
//
//	store/<key>/root.erofs      the read-only root a VM mounts under its overlay
//	store/<key>/manifest.json   inputs (Debian closure…), npm pins, steps, smoke-check outputs, sha256
//	refs/<recipe>               the key of the recipe's current image (refs/<recipe>.previous: the one before)
//	npm/                        the pinned npm tarballs
//	root-memo.json              tool versions and apt's closures, reused while unchanged
//	.root.lock                  flock held while building a root image
//
// <hash> is a hash of the inputs (package versions and hashes, guest
// binary hash, module list, BuilderVersion), so Ensure finds a current
// build without building, and any input change selects a new one.
package guestfs
