package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const twoObjects = `apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: Namespace
metadata: {name: b}
`

func TestReadsOnlyRegularFilesAndNeverBlocks(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ok.yaml"), []byte(twoObjects), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "x.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}
	for _, path := range []string{dir, fifo} {
		done := make(chan error, 1)
		go func() {
			_, err := Read([]string{path}, nil)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), fifo+": not a regular file") {
				t.Errorf("Read(%s): %v, want an error naming the FIFO", path, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Read(%s) blocks on a FIFO", path)
		}
	}
}

func TestReadLimitedStopsAtTheLimitOfAllInputs(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, []byte(twoObjects), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	size := int64(len(twoObjects))
	objs, err := ReadLimited([]string{a, b}, nil, 2*size)
	if err != nil || len(objs) != 4 {
		t.Fatalf("within the limit: %d objects, %v", len(objs), err)
	}
	objs, err = ReadLimited([]string{a, b}, nil, 2*size-1)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), b) {
		t.Fatalf("past the limit: %v, want ErrTooLarge naming %s", err, b)
	}
	if len(objs) != 2 {
		t.Errorf("past the limit: %d objects, want the 2 of %s", len(objs), a)
	}
	_, err = ReadLimited([]string{Stdin}, strings.NewReader(strings.Repeat("#", 1000)), 100)
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("stdin past the limit: %v", err)
	}
}

func TestADuplicateKeyIsAnError(t *testing.T) {
	_, err := Parse("dup.yaml", strings.NewReader("apiVersion: v1\nkind: Namespace\nmetadata: {name: a, name: b}\n"))
	if err == nil || !strings.Contains(err.Error(), "dup.yaml:3: parse: ") || !strings.Contains(err.Error(), `"name"`) {
		t.Fatalf("a duplicate key: %v, want an error naming the file, the line and the key", err)
	}
}
