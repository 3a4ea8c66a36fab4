package testcluster

import (
	"archive/tar"
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// pauseImageRef is the pod sandbox image of every real node (containerd's sandbox_image),
// built by buildPauseImage: a name of no registry, so that nothing could pull another.
const pauseImageRef = "virt-rules.local/testcluster/pause:1"

// pauseSource is the pause program (pause/main.go), built at test time.
//
//go:embed pause/main.go
var pauseSource []byte

// The annotations of an OCI index entry that name its image: containerd's own, and the OCI
// one `make images` (hack/images) writes.
const (
	containerdNameAnnotation = "io.containerd.image.name"
	ociRefAnnotation         = "org.opencontainers.image.ref.name"
)

// buildPauseImage compiles the pause program static, from a module of its own so that neither
// this module's go.work nor its GOFLAGS take part, and writes it into dir/layout as an OCI image
// layout of one layer (/pause, the entrypoint), named pauseImageRef.
func buildPauseImage(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", fmt.Errorf("build pause image: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module virt-rules.local/pause\n\ngo 1.24\n"), 0o644); err != nil {
		return "", fmt.Errorf("build pause image: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), pauseSource, 0o644); err != nil {
		return "", fmt.Errorf("build pause image: %w", err)
	}
	bin := filepath.Join(dir, "pause")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build pause: %w: %s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("build pause image: %w", err)
	}
	out := filepath.Join(dir, "layout")
	if err := writeOneFileImage(out, pauseImageRef, "pause", data); err != nil {
		return "", fmt.Errorf("build pause image: %w", err)
	}
	return out, nil
}

// writeOneFileImage writes an OCI image layout at dir holding one linux/amd64 image named ref
// whose one layer is the executable /name, its entrypoint.
func writeOneFileImage(dir, ref, name string, data []byte) error {
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	epoch := time.Unix(0, 0)
	for _, d := range []string{"dev/", "etc/", "proc/", "sys/", "tmp/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromReader(bytes.NewReader(layerTar.Bytes()), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("make layer: %w", err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = []string{"/" + name}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("set image config: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write layout %s: %w", dir, err)
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{ociRefAnnotation: ref, containerdNameAnnotation: ref}))
}

// LayoutImages are the references of the images in the OCI image layout at dir, as the CRI
// looks them up (CRIImageRef): what a pod's image must say to run one on a real node.
func LayoutImages(dir string) ([]string, error) {
	index, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read image layout %s: %w", dir, err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read image layout %s: %w", dir, err)
	}
	var refs []string
	for _, d := range manifest.Manifests {
		ref := d.Annotations[containerdNameAnnotation]
		if ref == "" {
			ref = d.Annotations[ociRefAnnotation]
		}
		if ref != "" {
			refs = append(refs, CRIImageRef(ref))
		}
	}
	if len(refs) == 0 {
		return nil, fmt.Errorf("image layout %s names no image (no %s annotation)", dir, ociRefAnnotation)
	}
	return refs, nil
}

// CRIImageRef is ref normalised as the CRI looks an image up: a name without a registry host
// is Docker Hub's (virt-rules/controller:v1 is docker.io/virt-rules/controller:v1, pause:1 is
// docker.io/library/pause:1). `ctr images import` keeps the name as written, which the CRI
// then never finds (ErrImageNeverPull), so importImages tags each image with this name too.
func CRIImageRef(ref string) string {
	first, _, hasSlash := strings.Cut(ref, "/")
	switch {
	case hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost"):
		return ref
	case hasSlash:
		return "docker.io/" + ref
	default:
		return "docker.io/library/" + ref
	}
}

// importImages imports each OCI image layout into the node's containerd (namespace k8s.io,
// the CRI's), each image also named as the CRI looks it up, and returns those names.
func (n *RealNode) importImages(ctx context.Context, layouts []string) ([]string, error) {
	var refs []string
	for i, dir := range layouts {
		names, err := LayoutImages(dir)
		if err != nil {
			return nil, err
		}
		archive := filepath.Join(n.Dir, fmt.Sprintf("image-%d.tar", i))
		if err := tarDir(dir, archive); err != nil {
			return nil, fmt.Errorf("import image %s: %w", dir, err)
		}
		_, err = n.ctr(ctx, "images", "import", archive)
		// The archive is a copy of the layout, not needed once containerd holds the content.
		if rmErr := os.Remove(archive); err == nil && rmErr != nil {
			err = rmErr
		}
		if err != nil {
			return nil, fmt.Errorf("import image %s: %w", dir, err)
		}
		refs = append(refs, names...)
	}
	out, err := n.ctr(ctx, "images", "list", "--quiet")
	if err != nil {
		return nil, err
	}
	have := strings.Fields(string(out))
	for _, name := range have {
		if full := CRIImageRef(name); full != name && !slices.Contains(have, full) {
			if _, err := n.ctr(ctx, "images", "tag", name, full); err != nil {
				return nil, err
			}
			have = append(have, full)
		}
	}
	for _, ref := range refs {
		if !slices.Contains(have, ref) {
			return nil, fmt.Errorf("import images: containerd of %s has no %s after the import (it has %s)", n.Name, ref, strings.Join(have, ", "))
		}
	}
	return refs, nil
}

// tarDir writes the files under dir into a tar archive at path, names relative to dir, as
// `ctr images import` reads an OCI layout.
func tarDir(dir, path string) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if closeErr := f.Close(); err == nil {
			err = closeErr
		}
	}()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		return err
	}
	return tw.Close()
}

// ctr runs containerd's own client against the node's containerd, in the CRI's namespace.
func (n *RealNode) ctr(ctx context.Context, args ...string) ([]byte, error) {
	return output(ctx, ctrBin, append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...)
}
