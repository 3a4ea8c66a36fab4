package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// BundleStore keeps the last good bundle downloaded from a bundle server, as served (signature
// included), and its ETag, so that an engine started while the server is down serves it. What
// a store returns is verified and validated again, as any bundle: a store need not be trusted
// more than the server. DirStore keeps it in a directory; a host may keep it elsewhere, such as
// in a ConfigMap that outlives its pods (internal/bundlecache).
type BundleStore interface {
	// Load returns the stored bundle and its ETag; raw is nil when none is stored.
	Load(ctx context.Context) (raw []byte, etag string, err error)
	// Save replaces the stored bundle and ETag.
	Save(ctx context.Context, raw []byte, etag string) error
	// Clear removes the stored bundle, if any.
	Clear(ctx context.Context) error
	// String names the store in logs and events.
	String() string
}

// Names of the persisted last good bundle in a DirStore (RemoteBundle.CacheDir).
const (
	CachedBundleFile = "bundle.tar.gz"
	cachedETagFile   = "bundle.etag"
)

// DirStore is a BundleStore in a directory: bundle.tar.gz and bundle.etag, each written by
// rename so that a crash never leaves a half-written file.
type DirStore string

// Load implements BundleStore.
func (d DirStore) Load(context.Context) ([]byte, string, error) {
	raw, err := os.ReadFile(filepath.Join(string(d), CachedBundleFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	etag, _ := os.ReadFile(filepath.Join(string(d), cachedETagFile))
	return raw, strings.TrimSpace(string(etag)), nil
}

// Save implements BundleStore.
func (d DirStore) Save(_ context.Context, raw []byte, etag string) error {
	dir := string(d)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeFileAtomic(dir, CachedBundleFile, bytes.NewReader(raw)); err != nil {
		return err
	}
	return writeFileAtomic(dir, cachedETagFile, strings.NewReader(etag))
}

// Clear implements BundleStore.
func (d DirStore) Clear(context.Context) error {
	var errs []error
	for _, name := range []string{CachedBundleFile, cachedETagFile} {
		if err := os.Remove(filepath.Join(string(d), name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (d DirStore) String() string { return filepath.Join(string(d), CachedBundleFile) }

func writeFileAtomic(dir, name string, r io.Reader) error {
	f, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(dir, name))
}
