// Command images builds virt-rules' container images offline and reproducibly, without a
// container engine and without pulling a base image (`make images`):
//
//   - controller: bin/virt-rules built static (CGO_ENABLED=0), as /usr/local/bin/virt-rules, a
//     passwd and group naming the non-root user 65532 it runs as, an empty /tmp;
//   - defaulter: bin/virt-rules built with -tags libvirt, on the files of the Debian packages
//     the VM defaults need (libvirt-daemon-driver-qemu, qemu-system-x86, qemu-system-arm and
//     every package they depend on, from `apt-get download`, unpacked with dpkg-deb -x); it
//     runs as root in its pod (examples/deploy/defaults/defaulter.yaml).
//
// Each is an OCI image layout under -out (go-containerregistry writes the image: layers,
// config, manifest, index); every file's time is the commit's and every owner root (or 65532),
// so the same commit gives the same digests. Binaries and packages are cached under -cache,
// keyed by version (a dirty tree's binaries are rebuilt every time). -verify then unpacks each
// image and runs its entrypoint in an isolated root (verify.go); -verify-defaulting also
// defaults a VM through the defaulter image's HTTP API.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// defaulterPackages are what the VM defaults need at run time (hack/libvirt.sh installs the same
// for the tests); their dependencies are added. qemu-system-arm is for arm64 guests; their EFI
// firmware (qemu-efi-aarch64, 260 MB installed) is not: the defaults define no loader.
var defaulterPackages = []string{"libvirt0", "libvirt-daemon-driver-qemu", "qemu-system-x86", "qemu-system-arm"}

// nonRoot is the controller's user and group.
const nonRoot = 65532

type builder struct {
	ctx      context.Context
	repo     string
	version  string
	revision string
	epoch    time.Time
	cache    string
	out      string
	// unpacked is each image's layer size before compression.
	unpacked map[string]int64
}

func main() {
	out := flag.String("out", "bin/images", "`DIR` of the OCI image layouts")
	cacheRoot := flag.String("cache", filepath.Join(userCache(), "virt-rules", "images"), "`DIR` caching binaries and Debian packages")
	only := flag.String("images", "controller,defaulter", "the images to build")
	verify := flag.Bool("verify", false, "unpack each image and run its entrypoint with version in an isolated root (root only: unshare, chroot)")
	verifyDefaulting := flag.Bool("verify-defaulting", false, "with -verify, also serve the defaulter image in the isolated root and default examples/defaults/vm.yaml through its HTTP API")
	flag.Parse()
	log.SetFlags(0)
	ctx := context.Background()
	b := &builder{ctx: ctx, out: *out, unpacked: map[string]int64{}}
	var err error
	if b.repo, err = git(ctx, "rev-parse", "--show-toplevel"); err != nil {
		log.Fatal(err)
	}
	if b.version, err = git(ctx, "describe", "--always", "--dirty", "--tags"); err != nil {
		log.Fatal(err)
	}
	if b.revision, err = git(ctx, "rev-parse", "HEAD"); err != nil {
		log.Fatal(err)
	}
	ct, err := git(ctx, "log", "-1", "--format=%ct")
	if err != nil {
		log.Fatal(err)
	}
	secs, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		log.Fatalf("commit time %q: %v", ct, err)
	}
	b.epoch = time.Unix(secs, 0).UTC()
	b.cache = filepath.Join(*cacheRoot, b.version)
	if err := os.MkdirAll(b.cache, 0o755); err != nil {
		log.Fatal(err)
	}
	for _, name := range strings.Split(*only, ",") {
		var img v1.Image
		switch name {
		case "controller":
			img, err = b.controller()
		case "defaulter":
			img, err = b.defaulter(filepath.Join(*cacheRoot, "debs"))
		default:
			err = fmt.Errorf("-images: %q: want controller or defaulter", name)
		}
		if err != nil {
			log.Fatalf("image %s: %v", name, err)
		}
		if err := b.write(name, img); err != nil {
			log.Fatalf("image %s: %v", name, err)
		}
		if *verify {
			if err := b.verify(name, img, *verifyDefaulting); err != nil {
				log.Fatalf("verify image %s: %v", name, err)
			}
		}
	}
}

// controller is the static binary, non-root.
func (b *builder) controller() (v1.Image, error) {
	bin, err := b.binary("virt-rules-static", []string{"CGO_ENABLED=0", "GOFLAGS=-buildvcs=true"})
	if err != nil {
		return nil, err
	}
	files := []file{
		{path: "etc/", mode: 0o755 | fs.ModeDir},
		{path: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonRoot, nonRoot))},
		{path: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonRoot))},
		{path: "home/", mode: 0o755 | fs.ModeDir},
		{path: "home/nonroot/", mode: 0o700 | fs.ModeDir, uid: nonRoot},
		{path: "tmp/", mode: 0o777 | fs.ModeDir | fs.ModeSticky},
		{path: "usr/", mode: 0o755 | fs.ModeDir},
		{path: "usr/local/", mode: 0o755 | fs.ModeDir},
		{path: "usr/local/bin/", mode: 0o755 | fs.ModeDir},
		{path: "usr/local/bin/virt-rules", mode: 0o755, src: bin},
	}
	return b.image(files, fmt.Sprintf("%d:%d", nonRoot, nonRoot), "controller", "virt-rules controller: KubeVirt's decisions as Rego, evaluated by an embedded OPA")
}

// defaulter is the libvirt binary on Debian's libvirt and QEMU.
func (b *builder) defaulter(debs string) (v1.Image, error) {
	bin, err := b.binary("virt-rules-libvirt", []string{"CGO_ENABLED=1", "GOFLAGS=-buildvcs=true -tags=libvirt"})
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "virt-rules-defaulter-root-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	pkgs, err := b.debs(debs)
	if err != nil {
		return nil, err
	}
	for _, deb := range pkgs {
		if err := run(b.ctx, "", nil, "dpkg-deb", "-x", deb, root); err != nil {
			return nil, err
		}
	}
	files, err := tree(root)
	if err != nil {
		return nil, err
	}
	files = append(files,
		// Debian's QEMU driver looks the user libvirt-qemu up when it starts, before it reads
		// qemu.conf (which the defaulter points at root): without it, connecting fails
		// ("Failed to parse user 'libvirt-qemu'").
		file{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nlibvirt-qemu:x:64055:64055:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin\n")},
		file{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nkvm:x:64054:libvirt-qemu\nlibvirt-qemu:x:64055:libvirt-qemu\n")},
		file{path: "tmp/", mode: 0o777 | fs.ModeDir | fs.ModeSticky},
		file{path: "usr/local/bin/virt-rules", mode: 0o755, src: bin})
	return b.image(dedupe(files), "0:0", "defaulter", "virt-rules defaulter: the VM defaults service, libvirt's QEMU driver embedded")
}

// binary builds ./cmd/virt-rules once per version, with -trimpath and no symbol table.
func (b *builder) binary(name string, env []string) (string, error) {
	path := filepath.Join(b.cache, name)
	if _, err := os.Stat(path); err == nil && !strings.HasSuffix(b.version, "-dirty") {
		log.Printf("%s: cached %s", name, path)
		return path, nil
	}
	log.Printf("%s: go build", name)
	tmp := path + ".tmp"
	if err := run(b.ctx, b.repo, env, "go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", tmp, "./cmd/virt-rules"); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// debs downloads defaulterPackages and their dependencies (Depends and Pre-Depends, as apt
// resolves them on this machine) into dir, once per package version.
func (b *builder) debs(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	args := append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, defaulterPackages...)
	out, err := output(b.ctx, "", "apt-cache", args...)
	if err != nil {
		return nil, err
	}
	var names []string
	seen := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if line == "" || line[0] == ' ' || line[0] == '<' || seen[line] {
			continue
		}
		seen[line] = true
		names = append(names, line)
	}
	sort.Strings(names)
	var debs, missing []string
	for _, n := range names {
		v, err := output(b.ctx, "", "apt-cache", "policy", n)
		if err != nil {
			return nil, err
		}
		candidate := ""
		for _, l := range strings.Split(v, "\n") {
			if c, ok := strings.CutPrefix(strings.TrimSpace(l), "Candidate: "); ok {
				candidate = c
			}
		}
		if candidate == "" || candidate == "(none)" {
			continue // a virtual package, provided by another in the list
		}
		matches, _ := filepath.Glob(filepath.Join(dir, n+"_"+strings.ReplaceAll(candidate, ":", "%3a")+"_*.deb"))
		if len(matches) == 1 {
			debs = append(debs, matches[0])
			continue
		}
		missing = append(missing, n+"="+candidate)
	}
	if len(missing) > 0 {
		log.Printf("apt-get download %d packages", len(missing))
		if err := run(b.ctx, dir, nil, "apt-get", append([]string{"download", "-q"}, missing...)...); err != nil {
			return nil, err
		}
		return b.debs(dir)
	}
	log.Printf("defaulter: %d Debian packages", len(debs))
	return debs, nil
}

// image is one layer of files on no base image, with the user, entrypoint and labels.
func (b *builder) image(files []file, user, cmd, title string) (v1.Image, error) {
	layerTar, err := b.tar(files)
	if err != nil {
		return nil, err
	}
	b.unpacked[cmd] = int64(len(layerTar))
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{CreatedBy: "hack/images", Created: v1.Time{Time: b.epoch}}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: b.epoch}
	cf.Config.User = user
	cf.Config.Entrypoint = []string{"/usr/local/bin/virt-rules"}
	cf.Config.Cmd = []string{cmd}
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "virt-rules " + cmd,
		"org.opencontainers.image.description": title,
		"org.opencontainers.image.version":     b.version,
		"org.opencontainers.image.revision":    b.revision,
		"org.opencontainers.image.created":     b.epoch.Format(time.RFC3339),
		"org.opencontainers.image.source":      "https://github.com/virt-rules/virt-rules",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	return mutate.ConfigFile(img, cf)
}

// write appends img to the OCI layout out/name, replacing what was there, and prints its
// reference, digest and size.
func (b *builder) write(name string, img v1.Image) error {
	dir := filepath.Join(b.out, name)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	ref := "virt-rules/" + name + ":" + b.version
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := imageSize(img)
	if err != nil {
		return err
	}
	unpacked := b.unpacked[name]
	fmt.Printf("%s\t%s\t%s\t%s compressed, %s unpacked\toci:%s\n", name, ref, digest, mib(size), mib(unpacked), dir)
	return nil
}

func imageSize(img v1.Image) (int64, error) {
	size, err := img.Size()
	if err != nil {
		return 0, err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return 0, err
	}
	total := size + int64(len(cfg))
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return 0, err
		}
		total += s
	}
	return total, nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// file is one entry of a layer: data or the file src, or a directory (path ending in /) or a
// symlink (link).
type file struct {
	path string
	mode fs.FileMode
	uid  int
	data []byte
	src  string
	link string
}

// tree lists root's files as layer entries (owner root, setuid and setgid bits dropped).
func tree(root string) ([]file, error) {
	var files []file
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		mode := info.Mode() &^ (fs.ModeSetuid | fs.ModeSetgid)
		switch {
		case d.IsDir():
			files = append(files, file{path: rel + "/", mode: mode})
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			files = append(files, file{path: rel, mode: mode, link: target})
		case mode.IsRegular():
			files = append(files, file{path: rel, mode: mode, src: path})
		default:
			return fmt.Errorf("%s: not a file, directory or symlink", path)
		}
		return nil
	})
	return files, err
}

// dedupe keeps the last entry of each path, and the directories each path needs.
func dedupe(files []file) []file {
	byPath := map[string]file{}
	for _, f := range files {
		byPath[f.path] = f
		for dir := filepath.Dir(strings.TrimSuffix(f.path, "/")); dir != "."; dir = filepath.Dir(dir) {
			if _, ok := byPath[dir+"/"]; !ok {
				byPath[dir+"/"] = file{path: dir + "/", mode: 0o755 | fs.ModeDir}
			}
		}
	}
	out := make([]file, 0, len(byPath))
	for _, f := range byPath {
		out = append(out, f)
	}
	return out
}

// tar writes files sorted by path, every time the commit's.
func (b *builder) tar(files []file) ([]byte, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: int64(f.mode.Perm()), Uid: f.uid, Gid: f.uid, ModTime: b.epoch, Format: tar.FormatPAX}
		if f.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		var data []byte
		switch {
		case strings.HasSuffix(f.path, "/"):
			h.Typeflag = tar.TypeDir
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		default:
			h.Typeflag = tar.TypeReg
			data = f.data
			if f.src != "" {
				var err error
				if data, err = os.ReadFile(f.src); err != nil {
					return nil, err
				}
			}
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.path, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func git(ctx context.Context, args ...string) (string, error) {
	return output(ctx, "", "git", args...)
}

func output(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func run(ctx context.Context, dir string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

func userCache() string {
	if d, err := os.UserCacheDir(); err == nil {
		return d
	}
	return os.TempDir()
}
