//go:build libvirt

package defaults

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/engine"
)

// WithLibvirt tells whether this binary was built with libvirt (the build tag libvirt).
const WithLibvirt = true

var eventLoop sync.Once

// Libvirt is libvirt's QEMU driver embedded in this process (qemu:///embed), rooted in a
// directory of its own, best on tmpfs. It is safe for concurrent use.
type Libvirt struct {
	conn     *libvirt.Connect
	root     string
	prefix   string // of this process's domain names
	seq      atomic.Uint64
	machines engine.Machines
	log      *slog.Logger
	closed   atomic.Bool
}

// OpenLibvirt starts the embedded QEMU driver rooted at root (created if missing; one process
// at a time may use a root), wipes the domains a crashed predecessor left behind, probes
// QEMU's capabilities and caches them by defining and undefining one domain, so the first
// request is as fast as any.
func OpenLibvirt(ctx context.Context, root string, log *slog.Logger) (*Libvirt, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("%w: libvirt root %s: %w", ErrUnavailable, root, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o700); err != nil {
		return nil, fmt.Errorf("%w: libvirt root: %w", ErrUnavailable, err)
	}
	if os.Geteuid() == 0 {
		// As root, Debian's QEMU driver would run (and probe) QEMU as libvirt-qemu and judge
		// its capabilities cache stale on every define.
		conf := []byte("# written by virt-rules\nuser = \"root\"\ngroup = \"root\"\n")
		if err := os.WriteFile(filepath.Join(root, "etc", "qemu.conf"), conf, 0o600); err != nil {
			return nil, fmt.Errorf("%w: libvirt root: %w", ErrUnavailable, err)
		}
	}
	if os.Geteuid() != 0 && os.Getenv("XDG_RUNTIME_DIR") == "" {
		// As another user, the driver keeps its sockets under XDG_RUNTIME_DIR.
		if err := os.MkdirAll(filepath.Join(root, "run"), 0o700); err != nil {
			return nil, fmt.Errorf("%w: libvirt root: %w", ErrUnavailable, err)
		}
		os.Setenv("XDG_RUNTIME_DIR", filepath.Join(root, "run"))
	}
	// Never start virtnetworkd & co. on the side.
	os.Setenv("LIBVIRT_AUTOSTART", "0")
	var loopErr error
	eventLoop.Do(func() {
		if loopErr = libvirt.EventRegisterDefaultImpl(); loopErr == nil {
			go func() {
				for {
					if err := libvirt.EventRunDefaultImpl(); err != nil {
						log.Error("libvirt event loop", "error", err)
					}
				}
			}()
		}
	})
	if loopErr != nil {
		return nil, fmt.Errorf("%w: event loop: %w", ErrUnavailable, loopErr)
	}
	conn, err := libvirt.NewConnect("qemu:///embed?root=" + root)
	if err != nil {
		return nil, fmt.Errorf("%w: connect qemu:///embed?root=%s: %w (as root, the system user libvirt-qemu must exist; .ci/run creates it)", ErrUnavailable, root, err)
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	l := &Libvirt{conn: conn, root: root, prefix: "virt-rules-" + hex.EncodeToString(suffix[:]), log: log}
	if err := l.start(ctx); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Libvirt) start(ctx context.Context) error {
	doms, err := l.conn.ListAllDomains(0)
	if err != nil {
		return fmt.Errorf("%w: list leftover domains: %w", ErrUnavailable, err)
	}
	for _, d := range doms {
		name, _ := d.GetName()
		if active, _ := d.IsActive(); active {
			_ = d.Destroy()
		}
		if err := d.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM); err != nil {
			d.Free()
			return fmt.Errorf("%w: undefine leftover domain %s: %w", ErrUnavailable, name, err)
		}
		d.Free()
		l.log.InfoContext(ctx, "undefined a leftover domain", "domain", name)
	}
	capsXML, err := l.conn.GetCapabilities()
	if err != nil {
		return fmt.Errorf("%w: capabilities: %w", ErrUnavailable, err)
	}
	var caps libvirtxml.Caps
	if err := caps.Unmarshal(capsXML); err != nil {
		return fmt.Errorf("%w: capabilities: %w", ErrUnavailable, err)
	}
	// The machine types of each architecture KubeVirt runs that this libvirt's QEMU emulates:
	// the host's, and arm64 where Debian's qemu-system-arm is installed (TCG, no KVM needed).
	l.machines = engine.Machines{}
	for _, g := range caps.Guests {
		arch, ok := kubevirtArch[g.Arch.Name]
		if g.OSType != "hvm" || !ok {
			continue
		}
		for _, m := range g.Arch.Machines {
			l.machines[arch] = append(l.machines[arch], m.Name)
			if m.Canonical != "" {
				l.machines[arch] = append(l.machines[arch], m.Canonical)
			}
		}
	}
	for arch, list := range l.machines {
		sort.Strings(list)
		l.machines[arch] = slices.Compact(list)
	}
	if host := kubevirtArch[caps.Host.CPU.Arch]; len(l.machines[host]) == 0 {
		return fmt.Errorf("%w: QEMU offers no %s machine (is qemu-system-%s installed?)", ErrUnavailable, caps.Host.CPU.Arch, caps.Host.CPU.Arch)
	}
	// The first define probes QEMU (seconds) and caches what it found under root.
	one := uint(1)
	probe := &libvirtxml.Domain{
		Type: "qemu", Memory: &libvirtxml.DomainMemory{Value: 65536, Unit: "KiB"}, VCPU: &libvirtxml.DomainVCPU{Value: one},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}},
	}
	if _, err := l.DefineAndRead(ctx, probe); err != nil {
		return fmt.Errorf("%w: probe QEMU with a first domain: %w", ErrUnavailable, err)
	}
	l.log.InfoContext(ctx, "libvirt ready", "root", l.root, "machines", len(l.machines["amd64"]), "arm64Machines", len(l.machines["arm64"]), "leftoversUndefined", len(doms))
	return nil
}

// kubevirtArch is KubeVirt's name of each libvirt guest architecture it runs.
var kubevirtArch = map[string]string{"x86_64": "amd64", "aarch64": "arm64"}

// Machines are the probed QEMU's machine types by architecture, aliases included, sorted.
func (l *Libvirt) Machines() engine.Machines { return l.machines }

// CapabilitiesDigest is the SHA-256 of libvirt's capabilities XML (QEMU's machine types and
// the host CPU): libvirt re-probes a QEMU binary that changed, so a new QEMU shows here.
func (l *Libvirt) CapabilitiesDigest(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if l.closed.Load() {
		return "", fmt.Errorf("%w: closed", ErrUnavailable)
	}
	caps, err := l.conn.GetCapabilities()
	if err != nil {
		return "", fmt.Errorf("%w: capabilities: %w", ErrUnavailable, err)
	}
	sum := sha256.Sum256([]byte(caps))
	return hex.EncodeToString(sum[:]), nil
}

// Root is the directory the driver keeps its state in.
func (l *Libvirt) Root() string { return l.root }

// DefineAndRead defines domain under a name and UUID of its own, reads its inactive XML and
// undefines it.
func (l *Libvirt) DefineAndRead(ctx context.Context, domain *libvirtxml.Domain) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if l.closed.Load() {
		return nil, fmt.Errorf("%w: closed", ErrUnavailable)
	}
	d := *domain
	d.Name = fmt.Sprintf("%s-%d", l.prefix, l.seq.Add(1))
	var id [16]byte
	_, _ = rand.Read(id[:])
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	d.UUID = fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16])
	doc, err := d.Marshal()
	if err != nil {
		return nil, fmt.Errorf("render domain XML: %w", err)
	}
	dom, err := l.conn.DomainDefineXML(doc)
	if err != nil {
		return nil, l.classify(err)
	}
	defer func() {
		if err := dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM); err != nil {
			l.log.Error("undefine", "domain", d.Name, "error", err)
		}
		dom.Free()
	}()
	out, err := dom.GetXMLDesc(libvirt.DOMAIN_XML_INACTIVE)
	if err != nil {
		return nil, fmt.Errorf("%w: read back domain %s: %w", ErrUnavailable, d.Name, err)
	}
	return []byte(out), nil
}

// classify tells libvirt refusing a domain from libvirt being unreachable.
func (l *Libvirt) classify(err error) error {
	var lerr libvirt.Error
	if !errors.As(err, &lerr) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	switch lerr.Code {
	case libvirt.ERR_NO_CONNECT, libvirt.ERR_INVALID_CONN, libvirt.ERR_RPC, libvirt.ERR_SYSTEM_ERROR,
		libvirt.ERR_OPERATION_TIMEOUT, libvirt.ERR_AUTH_FAILED, libvirt.ERR_NO_MEMORY:
		return fmt.Errorf("%w: %s", ErrUnavailable, lerr.Message)
	}
	if alive, aerr := l.conn.IsAlive(); aerr != nil || !alive {
		return fmt.Errorf("%w: %s", ErrUnavailable, lerr.Message)
	}
	return &RefusedError{Message: lerr.Message}
}

// Close disconnects; requests after it fail with ErrUnavailable. The root stays.
func (l *Libvirt) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	if _, err := l.conn.Close(); err != nil {
		return fmt.Errorf("close libvirt: %w", err)
	}
	return nil
}
