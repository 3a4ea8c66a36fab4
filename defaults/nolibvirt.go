//go:build !libvirt

package defaults

import (
	"context"
	"fmt"
	"log/slog"

	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/engine"
)

// WithLibvirt tells whether this binary was built with libvirt (the build tag libvirt).
const WithLibvirt = false

// Libvirt is a stand-in in binaries built without libvirt: it cannot be opened.
type Libvirt struct{}

// OpenLibvirt fails: this binary has no libvirt.
func OpenLibvirt(context.Context, string, *slog.Logger) (*Libvirt, error) {
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrNoLibvirt)
}

// Machines is empty.
func (*Libvirt) Machines() engine.Machines { return nil }

// Root is empty.
func (*Libvirt) Root() string { return "" }

// DefineAndRead fails.
func (*Libvirt) DefineAndRead(context.Context, *libvirtxml.Domain) ([]byte, error) {
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrNoLibvirt)
}

// CapabilitiesDigest fails.
func (*Libvirt) CapabilitiesDigest(context.Context) (string, error) {
	return "", fmt.Errorf("%w: %w", ErrUnavailable, ErrNoLibvirt)
}

// Close does nothing.
func (*Libvirt) Close() error { return nil }
