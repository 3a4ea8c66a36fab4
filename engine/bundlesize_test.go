package engine_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virt-rules/virt-rules/engine"
)

// manyFilesBomb is a small .tar.gz of n data files of size bytes each, every one under a
// file limit of size, together far over it.
func manyFilesBomb(t *testing.T, n, size int) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	body := append(append([]byte(`{"padding": "`), bytes.Repeat([]byte("a"), size-16)...), []byte(`"}`+"\n")...)
	for i := range n {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("/pad%d/data.json", i), Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBundleSizeLimitHoldsWhileUnpacking refuses a .tar.gz of 64 files of 4 MiB, each under
// the 8 MiB file limit, together 8 times the 32 MiB size limit: from a path and from a
// server, before they are all in memory; and a directory of files over the limit together.
func TestBundleSizeLimitHoldsWhileUnpacking(t *testing.T) {
	ctx := context.Background()
	const files, size = 64, 4 << 20
	limits := []engine.Option{engine.WithBundleFileLimit(8 << 20), engine.WithBundleSizeLimit(32 << 20)}
	tarball := manyFilesBomb(t, files, size)
	path := filepath.Join(t.TempDir(), "bomb.tar.gz")
	if err := os.WriteFile(path, tarball, 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(ctx, limits...)
	if err != nil {
		t.Fatal(err)
	}
	grew := heapPeak(func() { err = e.LoadPath(ctx, path) })
	t.Logf("a %d KiB tarball of %d files of %d MiB from a path: heap peak +%d MiB: %v", len(tarball)>>10, files, size>>20, grew>>20, err)
	if !errors.Is(err, engine.ErrBundleTooLarge) || !errors.Is(err, engine.ErrBundleRefused) || !strings.Contains(err.Error(), "over the bundle size limit of 33554432") {
		t.Fatalf("%v, want refused over the size limit", err)
	}
	if grew > 64<<20 {
		t.Errorf("the heap grew by %d MiB reading it, want under 64 MiB (the files are %d MiB)", grew>>20, files*size>>20)
	}
	if e.Source() != engine.SourceEmbedded || decidePolicy(t, e) != "b-app" {
		t.Errorf("serving %s after the refusal, want the embedded bundle still", e.Source())
	}

	srv := newBundleServer(t)
	srv.serve(tarball)
	cache := t.TempDir()
	remote, err := engine.New(ctx, append(limits, engine.WithRemoteBundle(engine.RemoteBundle{
		AllowHTTP: true, URL: srv.url(), MinDelay: time.Second, MaxDelay: time.Second, CacheDir: cache}))...)
	if err != nil {
		t.Fatal(err)
	}
	grew = heapPeak(func() { err = remote.UpdateBundle(ctx) })
	t.Logf("from a server: heap peak +%d MiB: %v", grew>>20, err)
	if !errors.Is(err, engine.ErrBundleTooLarge) || !strings.Contains(err.Error(), "over the bundle size limit of 33554432") || engine.RefusalReason(err) != engine.ReasonRead {
		t.Fatalf("from a server: %v, want refused over the size limit", err)
	}
	if grew > 64<<20 {
		t.Errorf("the heap grew by %d MiB downloading it, want under 64 MiB", grew>>20)
	}
	if entries, _ := os.ReadDir(cache); remote.Revision() != "" || len(entries) != 0 {
		t.Errorf("revision %q and %d files persisted after the refusal, want none", remote.Revision(), len(entries))
	}

	dir := bundleDir(t, func(dir string) {
		for i := range 12 {
			writeFile(t, filepath.Join(dir, fmt.Sprintf("pad%d.json", i)), `{"padding": "`+strings.Repeat("a", 1<<20)+`"}`)
		}
	})
	small, err := engine.New(ctx, engine.WithBundleSizeLimit(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	if err := small.LoadPath(ctx, dir); !errors.Is(err, engine.ErrBundleTooLarge) {
		t.Errorf("a directory of 12 MiB of files: %v, want refused over the 8 MiB size limit", err)
	}
}
