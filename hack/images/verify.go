package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"sigs.k8s.io/yaml"
)

// isolate runs its arguments (chroot ROOT ...) in new mount and PID namespaces, with a fresh
// /proc, a read-only /sys (the kernel's, as a container runtime gives a pod), an empty /run and
// a /dev of four device nodes on tmpfs: nothing of the host's file system is visible in ROOT.
const isolate = `set -eu
root=$1; shift
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys"
mount -t tmpfs -o mode=0755 run "$root/run"
mount -t tmpfs -o mode=0755,size=64k dev "$root/dev"
mknod -m 666 "$root/dev/null" c 1 3
mknod -m 666 "$root/dev/zero" c 1 5
mknod -m 666 "$root/dev/random" c 1 8
mknod -m 666 "$root/dev/urandom" c 1 9
mount -t tmpfs -o mode=1777 shm "$root/dev/shm" 2>/dev/null || { mkdir "$root/dev/shm" && mount -t tmpfs -o mode=1777 shm "$root/dev/shm"; }
exec "$@"`

// verify unpacks img and runs its entrypoint with `version` in an isolated root, as the
// image's user; for the defaulter with defaulting, it also defaults examples/defaults/vm.yaml
// through the service's HTTP API. The entrypoint is PID 1 there, as in a pod: the defaulter
// then acts as init and reaps the QEMU processes libvirt's capability probe leaves
// (cmd/virt-rules/init_linux.go); without that, readiness took more than the 3 minutes allowed.
func (b *builder) verify(name string, img v1.Image, defaulting bool) error {
	root, err := os.MkdirTemp("", "virt-rules-image-"+name+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	// The image's / as a container runtime makes it: anyone may enter.
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	if err := unpack(img, root); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	for _, d := range []string{"proc", "sys", "run", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	entry := append(append([]string{}, cf.Config.Entrypoint...), "version")
	out, err := b.isolated(b.ctx, root, cf.Config.User, entry...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s in an isolated root: %w: %s", strings.Join(entry, " "), err, out)
	}
	if !strings.HasPrefix(string(out), "virt-rules ") {
		return fmt.Errorf("%s: %q, want the version", strings.Join(entry, " "), out)
	}
	log.Printf("verify %s: %s as %s in an isolated root: %s", name, strings.Join(entry, " "), cf.Config.User, strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", "; "))
	if name == "defaulter" && defaulting {
		return b.verifyDefaulter(root, cf)
	}
	return nil
}

// verifyDefaulter serves the defaulter from the image and defaults one VM through its API.
func (b *builder) verifyDefaulter(root string, cf *v1.ConfigFile) error {
	addr, err := freePort()
	if err != nil {
		return err
	}
	args := append(append([]string{}, cf.Config.Entrypoint...), "defaulter", "--listen", addr, "--insecure-http", "--libvirt-root=/dev/shm/virt-rules-defaults")
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	cmd := b.isolated(ctx, root, cf.Config.User, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	hc := &http.Client{Timeout: 30 * time.Second}
	for {
		resp, err := hc.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("defaulter not ready in 3 minutes: %v; log:\n%s", err, logs.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	log.Printf("verify defaulter: ready in the isolated root after %s", time.Since(start).Round(100*time.Millisecond))
	vm, err := os.ReadFile(filepath.Join(b.repo, "examples", "defaults", "vm.yaml"))
	if err != nil {
		return err
	}
	body, err := yaml.YAMLToJSON(vm)
	if err != nil {
		return err
	}
	resp, err := hc.Post("http://"+addr+"/apis/vms/defaults?dryRun=true", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	patch, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(patch, []byte(`"op":"add"`)) || !bytes.Contains(patch, []byte("macAddress")) {
		return fmt.Errorf("defaulting examples/defaults/vm.yaml: %s: %s; log:\n%s", resp.Status, patch, logs.String())
	}
	log.Printf("verify defaulter: examples/defaults/vm.yaml defaulted through the HTTP API in the isolated root: %d bytes of JSON patch (%s)", len(patch), firstOps(patch))
	return nil
}

func firstOps(patch []byte) string {
	s := string(patch)
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

// isolated is `unshare --mount --pid --fork` of the isolate script, then chroot as user.
func (b *builder) isolated(ctx context.Context, root, user string, args ...string) *exec.Cmd {
	chroot := append([]string{"chroot", "--userspec=" + user, root}, args...)
	full := append([]string{"--mount", "--pid", "--fork", "--kill-child", "sh", "-c", isolate, "isolate", root}, chroot...)
	cmd := exec.CommandContext(ctx, "unshare", full...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"}
	return cmd
}

// unpack writes img's file system (mutate.Extract: the layers flattened) under root.
func unpack(img v1.Image, root string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		path := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, path); err != nil {
				return err
			}
			continue
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected type %c", h.Name, h.Typeflag)
		}
		if err := os.Chmod(path, os.FileMode(h.Mode)&os.ModePerm|stickyOf(h.Mode)); err != nil {
			return err
		}
		if err := os.Lchown(path, h.Uid, h.Gid); err != nil {
			return err
		}
	}
}

func stickyOf(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
