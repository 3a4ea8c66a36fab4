package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// WatchBundle reloads the bundle at path whenever its content changes, polling every
// interval until ctx ends. Polling a content digest (rather than file events) works the same
// for a directory, a tarball replaced by rename, and a ConfigMap volume's symlink swap.
// A change that is refused is logged and reported to onLoad (which may be nil); the last good
// bundle keeps serving and the same content is not retried until it changes again.
func (e *Engine) WatchBundle(ctx context.Context, path string, interval time.Duration, onLoad func(error)) {
	// Start from what is serving: a change made before the first poll is still seen.
	var last string
	if g := e.active.Load(); g.source == path {
		last = g.digest
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		d, err := digestPath(path)
		if err != nil {
			e.log.WarnContext(ctx, "watch bundle", "path", path, "error", err)
			continue
		}
		if d == last {
			continue
		}
		last = d
		err = e.LoadPath(ctx, path)
		if onLoad != nil {
			onLoad(err)
		}
	}
}

// bundleFile tells whether the OPA bundle loader reads a file of this name: policies, data,
// the manifest, signatures, Wasm. Anything else in a bundle directory (an editor's swap file,
// a file being written before its rename) is not part of the bundle, so it must not make the
// watcher reload a bundle whose files have not changed yet.
func bundleFile(name string) bool {
	switch filepath.Ext(name) {
	case ".rego", ".json", ".yaml", ".yml", ".manifest", ".wasm":
		return true
	}
	return false
}

// digestPath hashes the names and contents of the bundle files under path (every file of a
// directory the bundle loader reads), or of path itself when it is a file (a tarball).
func digestPath(path string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || (p != path && !bundleFile(d.Name())) {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		fmt.Fprintf(h, "%s\x00", p)
		_, err = io.Copy(h, f)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("digest %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
