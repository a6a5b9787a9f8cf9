// Package securefs opens files for a root process without trusting anything
// that an untrusted local user (a task user, a job's workload) can write.
//
// Two uses:
//   - Dir is a private state directory: every component of its path is
//     checked on open (owned by root or us, not writable by others unless
//     sticky), the directory itself must be ours with mode 0700, and every
//     file in it is opened relative to the directory's fd without following
//     symlinks (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS).
//   - ReadBeneath reads a small regular file below a directory that others
//     may write (a task's secrets dir), refusing symlinks, "..", FIFOs,
//     devices, hard links and anything over a size cap.
//
// Linux only (openat2 needs kernel 5.6).
package securefs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// resolve is what every open below a directory fd refuses: absolute paths,
// "..", symlinks and magic links (/proc/*/fd/*).
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// InsecureError says why a directory cannot be trusted, and how to fix it.
type InsecureError struct {
	Path string
	Why  string
	Fix  string
}

func (e *InsecureError) Error() string {
	return fmt.Sprintf("%s %s: %s", e.Path, e.Why, e.Fix)
}

// Dir is an open private directory.
type Dir struct {
	fd   int
	path string
}

// Path is the directory's path as it was opened.
func (d *Dir) Path() string { return d.path }

// Close releases the directory fd.
func (d *Dir) Close() error {
	if d == nil || d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// OpenPrivate opens the absolute directory path, creating missing components
// with mode 0700 when create is set. Every ancestor must be owned by root or
// by us and must not be writable by group or others unless it is sticky
// (like /tmp); the directory itself must be ours and have no group or other
// permission bits. Otherwise anyone who can write an ancestor could swap the
// directory for one of their own.
func OpenPrivate(path string, create bool) (*Dir, error) {
	if !filepath.IsAbs(path) {
		return nil, &InsecureError{Path: path, Why: "is not an absolute path", Fix: "give an absolute path"}
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /: %w", err)
	}
	cur := "/"
	if err := checkAncestor(fd, cur); err != nil {
		unix.Close(fd)
		return nil, err
	}
	parts := strings.Split(strings.Trim(filepath.Clean(path), "/"), "/")
	for i, name := range parts {
		if name == "" {
			continue
		}
		last := i == len(parts)-1
		next, err := openDirAt(fd, name, create)
		unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", filepath.Join(cur, name), err)
		}
		fd, cur = next, filepath.Join(cur, name)
		if last {
			break
		}
		if err := checkAncestor(fd, cur); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	if err := checkPrivate(fd, cur); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Dir{fd: fd, path: cur}, nil
}

// Sub opens (and, with create, makes) the private subdirectory name, which
// must be a single path component.
func (d *Dir) Sub(name string, create bool) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	fd, err := openDirAt(d.fd, name, create)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(d.path, name), err)
	}
	p := filepath.Join(d.path, name)
	if err := checkPrivate(fd, p); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Dir{fd: fd, path: p}, nil
}

// Names lists the entries of d (any kind; "." and ".." left out).
func (d *Dir) Names() ([]string, error) {
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.path, err)
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	return f.Readdirnames(-1)
}

// openDirAt opens name below dirfd as a directory, without following a
// symlink, creating it 0700 first if asked.
func openDirAt(dirfd int, name string, create bool) (int, error) {
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolve}
	fd, err := unix.Openat2(dirfd, name, how)
	if errors.Is(err, unix.ENOENT) && create {
		if err := unix.Mkdirat(dirfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		fd, err = unix.Openat2(dirfd, name, how)
	}
	return fd, err
}

func fstat(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	return st, err
}

func checkAncestor(fd int, path string) error {
	st, err := fstat(fd)
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return &InsecureError{Path: path, Why: "is owned by uid " + strconv.Itoa(int(st.Uid)),
			Fix: "every directory above the state dir must be owned by root"}
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return &InsecureError{Path: path, Why: fmt.Sprintf("is writable by group or others (mode %04o)", st.Mode&0o7777),
			Fix: "every directory above the state dir must be writable only by root (or sticky, like /tmp)"}
	}
	return nil
}

func checkPrivate(fd int, path string) error {
	st, err := fstat(fd)
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return &InsecureError{Path: path,
			Why: fmt.Sprintf("is owned by uid %d with mode %04o", st.Uid, st.Mode&0o7777),
			Fix: fmt.Sprintf("it must be a directory owned by uid %d with mode 0700 (chown %d %s && chmod 0700 %s)",
				os.Geteuid(), os.Geteuid(), path, path)}
	}
	return nil
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("invalid file name %q: one path component is required", name)
	}
	return nil
}

// openAt opens name in d without following symlinks.
func (d *Dir) openAt(name string, flags int, mode uint32) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	fd, err := unix.Openat2(d.fd, name, &unix.OpenHow{
		Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Mode: uint64(mode), Resolve: resolve})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(d.path, name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.path, name)), nil
}

var tmpSeq atomic.Uint64

// WriteFile replaces name atomically (a fresh temporary file, then rename),
// mode 0600, so a reader never sees half a file.
func (d *Dir) WriteFile(name string, b []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	tmp := fmt.Sprintf(".%s.%d.%d.tmp", name, os.Getpid(), tmpSeq.Add(1))
	f, err := d.openAt(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return err
	}
	if err := unix.Renameat(d.fd, tmp, d.fd, name); err != nil {
		_ = unix.Unlinkat(d.fd, tmp, 0)
		return &os.PathError{Op: "rename", Path: filepath.Join(d.path, name), Err: err}
	}
	return nil
}

// AppendFile appends b to name (created 0600) in one write.
func (d *Dir) AppendFile(name string, b []byte) error {
	f, err := d.openAt(name, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	return errors.Join(werr, f.Close())
}

// Open opens the regular file name for reading.
func (d *Dir) Open(name string) (*os.File, error) {
	f, err := d.openAt(name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(f, -1); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReadFile reads the regular file name, at most max bytes.
func (d *Dir) ReadFile(name string, max int64) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAtMost(f, max)
}

// Remove removes the file name; a missing file is no error.
func (d *Dir) Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	err := unix.Unlinkat(d.fd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return &os.PathError{Op: "remove", Path: filepath.Join(d.path, name), Err: err}
}

// RemoveSub removes the subdirectory name and the files in it (one level:
// private state dirs hold only files). A missing directory is no error.
func (d *Dir) RemoveSub(name string) error {
	sub, err := d.Sub(name, false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	fd, err := unix.Openat(sub.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		f := os.NewFile(uintptr(fd), sub.path)
		names, _ := f.Readdirnames(-1)
		f.Close()
		for _, n := range names {
			_ = unix.Unlinkat(sub.fd, n, 0)
		}
	}
	sub.Close()
	if err := unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: filepath.Join(d.path, name), Err: err}
	}
	return nil
}

// RemoveEmptySub removes the subdirectory name if it is empty.
func (d *Dir) RemoveEmptySub(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: filepath.Join(d.path, name), Err: err}
	}
	return nil
}

// ErrNotRegular is returned for anything but a regular file with one link.
var ErrNotRegular = errors.New("not a regular file")

func checkRegular(f *os.File, max int64) error {
	st, err := fstat(int(f.Fd()))
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s: %w (it is a FIFO, device, socket or directory)", f.Name(), ErrNotRegular)
	}
	if st.Nlink != 1 {
		return fmt.Errorf("%s: %w: it has %d hard links, want 1", f.Name(), ErrNotRegular, st.Nlink)
	}
	if max >= 0 && st.Size > max {
		return fmt.Errorf("%s: %d bytes, more than the %d allowed", f.Name(), st.Size, max)
	}
	return nil
}

func readAtMost(f *os.File, max int64) ([]byte, error) {
	if max < 0 {
		return io.ReadAll(f)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: more than the %d bytes allowed", f.Name(), max)
	}
	return b, nil
}

// ReadBeneath reads rel, a relative path below the directory root, as a
// regular file of at most max bytes. root itself is trusted (the caller
// names it); everything below it may be written by others, so the open
// refuses symlinks anywhere in rel, "..", and absolute paths, and the file
// must be a regular file with a single link (no hard link to a file
// elsewhere) opened without blocking (a FIFO cannot hang the reader).
func ReadBeneath(root, rel string, max int64) ([]byte, error) {
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, rel, &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolve})
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return nil, fmt.Errorf("%s: a symlink or a path that leaves %s is not allowed", rel, root)
		}
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := checkRegular(f, max); err != nil {
		return nil, err
	}
	return readAtMost(f, max)
}

// ReplaceBeneath writes b, with mode, as the regular file name in dir, a
// directory below root that others may write (an allocation's shared
// dir), replacing whatever name was. root is trusted (the caller names
// it); dir is opened without following symlinks or leaving root. The
// file is written under a fresh name created with O_EXCL (never an
// existing file or a symlink's target) and renamed over name, which
// replaces a symlink planted there rather than following it. A directory
// at name is an error.
func ReplaceBeneath(root, dir, name string, b []byte, mode os.FileMode) error {
	if err := checkName(name); err != nil {
		return err
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rfd)
	dfd, err := unix.Openat2(rfd, dir, &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolve})
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return fmt.Errorf("%s: a symlink or a path that leaves %s is not allowed", dir, root)
		}
		return &os.PathError{Op: "open", Path: filepath.Join(root, dir), Err: err}
	}
	defer unix.Close(dfd)
	tmp := "." + name + ".tmp-" + strconv.FormatUint(tmpSeq.Add(1), 10) + "-" + strconv.Itoa(os.Getpid())
	fd, err := unix.Openat2(dfd, tmp, &unix.OpenHow{
		Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Mode:  uint64(mode.Perm()), Resolve: resolve})
	if err != nil {
		return &os.PathError{Op: "create", Path: filepath.Join(root, dir, tmp), Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Chmod(mode.Perm()) // past the umask
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, name)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return &os.PathError{Op: "write", Path: filepath.Join(root, dir, name), Err: werr}
	}
	return nil
}
