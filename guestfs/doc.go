// Package guestfs builds the guest boot assets (kernel, initramfs) from
// Debian packages and the capsem binary itself, and caches them.
package guestfs
