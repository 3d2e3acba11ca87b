// Package guestfs turns recipes into the artefacts a VM is made of, and
// keeps them in one content-addressed store.
//
// A recipe (recipes/*.toml, embedded; see Recipe) is data: packages, npm
// tarballs, files, the build steps its kind implies. There are three
// today, one per kind:
//
//	kernel.toml   kind kernel     Debian's linux-image-amd64 (its ABI package, fetched with
//	                              apt-get download, unpacked with dpkg-deb -x, never
//	                              installed): vmlinuz, the vmlinux extracted from it (QEMU
//	                              boots it through its PVH entry), and the listed modules
//	                              with their dependencies, unsigned and prepatched
//	minimal.toml  kind initramfs  the minimal root every VM boots: busybox-static and its
//	                              applet links, the CGO-free capsem build as /init (and its
//	                              links), the kernel artefact's modules with their load
//	                              order, a minimal /etc
//	full.toml     kind root       the full root: Debian (mmdebstrap), Node, npm and the AI
//	                              CLIs (npm tarballs pinned by integrity), their settings,
//	                              smoke checks in a chroot, packed as EROFS
//
// Another architecture or platform is another recipe (and, where its
// build steps differ, the builder's support for them), not another
// pipeline.
//
// Every artefact is built the same way: its key is the sha256 of its
// inputs (the recipe's bytes, the exact Debian package versions and .deb
// hashes or the whole Debian closure, the guest binary's sha256 for the
// minimal root, the key of the kernel artefact it is built from, the
// tools' versions for a root image, and the builder's version), so Ensure
// and EnsureRoot find a current artefact without building and any input
// change selects a new one. The minimal root's key covers the kernel by
// its artefact's key, so a new guest binary rebuilds only the initramfs,
// in milliseconds, from the kernel already in the store. A build runs in
// a work directory under the recipe's build lock; the finished directory
// is renamed into the store and the recipe's ref replaced by rename under
// the store lock, never rewritten in place. Under Options.Dir
// ($CAPSEM_HOME/assets):
//
//	store/<key24>/manifest.json    kind, recipe, key, the entries it depends on, every file's
//	                               size and sha256 (re-checked through the sum cache on every
//	                               use, in full by Verify), the inputs, build facts
//	store/<key24>/vmlinux          a kernel: the uncompressed ELF kernel with the PVH note
//	store/<key24>/vmlinuz          a kernel: Debian's bzImage, the fallback
//	store/<key24>/lib/modules/…    a kernel: the selected modules at their guest paths
//	store/<key24>/initramfs.cpio   a minimal root: uncompressed newc
//	store/<key24>/root.erofs       a root image: the read-only root a VM mounts under its overlay
//	refs/<recipe>                  the key of the recipe's current artefact: refs/kernel,
//	                               refs/minimal, refs/full
//	refs/<recipe>.previous         the key it named before
//	boot-states/<key24>/           saved boots of the minimal root of that key
//	debs/                          the downloaded .debs, so rebuilds do not fetch 70 MB again
//	npm/                           the pinned npm tarballs
//	apt-resolution.json            apt's answers, reused while its package lists are unchanged
//	root-memo.json                 tool versions and apt's closures for root images
//	.sums.json                     sha256 of files by identity (see sumCache)
//	locks/<recipe>.lock            flock held while building the recipe
//	.store.lock                    flock held while publishing, moving a ref or pruning
//	.work-<recipe>-*/              a build in progress
//
// Pruning (on every ref change) keeps what a ref or previous ref names and
// what those depend on (a minimal root's kernel), and removes every other
// entry with its saved boots: a VM that resolved its files just before a
// rebuild still finds them. It also removes what the layout before the
// store left: the <hash24>/ asset directories beside it (with their saved
// boots), the kernels/ stage cache and stale work directories.
//
// Assets (Ensure, Build, Load, Installed) are the minimal root and its
// kernel, resolved from the store; Root (EnsureRoot, BuildRoot,
// ResolveRoot, RootStatus) is a root image.
package guestfs
