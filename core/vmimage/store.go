// Package vmimage keeps the images forks make (paths.ImagesDir): one
// directory per image, holding image.json (api.Image), the disk as it was
// (disk.img, raw and sparse) and the workspace (workspace/). An image is
// never changed once published: VMs made from it have a copy-on-write
// layer over its disk (MakeLayer), so it may be deleted only when none
// remains, which its owner (the service) checks.
//
// A fork is made in a staging directory beside the images and renamed
// into place whole, so an image is there complete or not at all; a
// crash leaves a staging directory that the next Store.Sweep removes.
package vmimage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/capsem/capsem/core/api"
)

// Names of an image directory's files.
const (
	metaFile      = "image.json"
	diskFile      = "disk.img"
	workspaceDir  = "workspace"
	stateDir      = "state"
	stagingPrefix = ".staging-"
	removingDir   = ".removing-"
)

// NamePattern is the form of an image name: a VM name's.
var NamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ErrNotFound is wrapped by the error for an image that does not exist.
var ErrNotFound = errors.New("no such image")

// ErrExists is wrapped by Publish's error when the name is taken.
var ErrExists = errors.New("an image of that name exists")

// Store is the images under Dir.
type Store struct{ Dir string }

func checkName(name string) error {
	if !NamePattern.MatchString(name) {
		return fmt.Errorf("image name %q: use lower-case letters, digits and '-', starting with a letter or digit, at most 63", name)
	}
	return nil
}

func (s Store) path(name string) string { return filepath.Join(s.Dir, name) }

// Disk is the image's disk file.
func (s Store) Disk(name string) string { return filepath.Join(s.path(name), diskFile) }

// Workspace is the image's copy of the source's workspace.
func (s Store) Workspace(name string) string { return filepath.Join(s.path(name), workspaceDir) }

// State is the image's saved VM state (a memory fork's): the files of a
// suspend (paths.Session.Suspend), to be placed in a new VM's session.
func (s Store) State(name string) string { return filepath.Join(s.path(name), stateDir) }

// Stage makes an empty staging directory for an image of name, with its
// workspace directory; the fork fills it (StagedDisk, StagedWorkspace)
// and Publish makes it the image, or Discard removes it.
func (s Store) Stage(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return "", fmt.Errorf("images directory: %w", err)
	}
	dir, err := os.MkdirTemp(s.Dir, stagingPrefix+name+"-")
	if err != nil {
		return "", fmt.Errorf("staging image %s: %w", name, err)
	}
	return dir, nil
}

// StagedDisk and StagedWorkspace are where a fork copies the disk and the
// workspace in a staging directory.
func StagedDisk(staging string) string      { return filepath.Join(staging, diskFile) }
func StagedWorkspace(staging string) string { return filepath.Join(staging, workspaceDir) }
func StagedState(staging string) string     { return filepath.Join(staging, stateDir) }

// Discard removes a staging directory.
func (s Store) Discard(staging string) {
	if s.isStaging(staging) {
		os.RemoveAll(staging)
	}
}

func (s Store) isStaging(dir string) bool {
	return filepath.Dir(dir) == filepath.Clean(s.Dir) && strings.HasPrefix(filepath.Base(dir), stagingPrefix)
}

// IsStaging reports whether dir is a staging directory of this store: the
// only place a VM's process copies a fork into.
func (s Store) IsStaging(dir string) bool {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return false
	}
	st, err := os.Lstat(dir)
	return err == nil && st.IsDir() && s.isStaging(dir)
}

// Publish writes img's metadata into staging and renames it to the image
// img.Name. A taken name fails with ErrExists and leaves staging as it is.
func (s Store) Publish(staging string, img api.Image) error {
	if err := checkName(img.Name); err != nil {
		return err
	}
	if !s.isStaging(staging) {
		return fmt.Errorf("publishing image %s: %s is not a staging directory of %s", img.Name, staging, s.Dir)
	}
	img.Format = api.ImageFormat
	img.UsedBy, img.Problem = nil, ""
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(staging, metaFile), append(b, '\n')); err != nil {
		return fmt.Errorf("publishing image %s: %w", img.Name, err)
	}
	// rename(2) onto an existing non-empty directory fails (ENOTEMPTY or
	// EEXIST); onto an empty one it would succeed, and an image
	// directory is never empty.
	if err := os.Rename(staging, s.path(img.Name)); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, errNotEmpty) {
			return fmt.Errorf("image %q: %w", img.Name, ErrExists)
		}
		return fmt.Errorf("publishing image %s: %w", img.Name, err)
	}
	if d, err := os.Open(s.Dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Get reads the image name. Problem is set when no VM can be made from it
// (a newer format, a disk or root image that is gone).
func (s Store) Get(name string) (api.Image, error) {
	if err := checkName(name); err != nil {
		return api.Image{}, fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	b, err := os.ReadFile(filepath.Join(s.path(name), metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return api.Image{}, fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return api.Image{}, fmt.Errorf("image %q: %w", name, err)
	}
	var img api.Image
	if err := json.Unmarshal(b, &img); err != nil {
		return api.Image{}, fmt.Errorf("image %q: its %s: %w", name, metaFile, err)
	}
	if img.Name != name {
		return api.Image{}, fmt.Errorf("image %q: its %s names %q", name, metaFile, img.Name)
	}
	img.Problem = s.problem(img)
	return img, nil
}

// problem says why no VM can be made from img now, or "".
func (s Store) problem(img api.Image) string {
	if img.Format > api.ImageFormat {
		return fmt.Sprintf("format %d, newer than this capsem reads (%d)", img.Format, api.ImageFormat)
	}
	if st, err := os.Stat(s.Disk(img.Name)); err != nil || !st.Mode().IsRegular() {
		return "its disk " + s.Disk(img.Name) + " is missing"
	}
	if img.Memory {
		if st, err := os.Stat(s.State(img.Name)); err != nil || !st.IsDir() {
			return "its saved state " + s.State(img.Name) + " is missing"
		}
	}
	if img.RootImage != "" {
		if _, err := os.Stat(img.RootImage); err != nil {
			return fmt.Sprintf("the root image it was made over (%s) is gone; a VM of it cannot boot (fork a VM of the current root again)", img.RootImage)
		}
	}
	return ""
}

// List reads every image, sorted by name; each image that cannot be read
// is an error of its own.
func (s Store) List() ([]api.Image, []error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []api.Image{}, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("images: %w", err)}
	}
	out := []api.Image{}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !NamePattern.MatchString(e.Name()) {
			continue
		}
		img, err := s.Get(e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, img)
	}
	slices.SortFunc(out, func(a, b api.Image) int { return strings.Compare(a.Name, b.Name) })
	return out, errs
}

// Remove deletes the image name: renamed aside first, so it is gone at
// once and whole, then its files removed.
func (s Store) Remove(name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	aside, err := os.MkdirTemp(s.Dir, removingDir)
	if err != nil {
		return fmt.Errorf("removing image %s: %w", name, err)
	}
	target := filepath.Join(aside, name)
	if err := os.Rename(s.path(name), target); err != nil {
		os.Remove(aside)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("image %q: %w", name, ErrNotFound)
		}
		return fmt.Errorf("removing image %s: %w", name, err)
	}
	return os.RemoveAll(aside)
}

// Sweep removes what a crash left: staging directories of forks that did
// not finish and images half removed. Only the store's owner calls it,
// at its start, when no fork is under way.
func (s Store) Sweep() {
	ents, _ := os.ReadDir(s.Dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), stagingPrefix) || strings.HasPrefix(e.Name(), removingDir) {
			os.RemoveAll(filepath.Join(s.Dir, e.Name()))
		}
	}
}
