package defaults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/engine"
)

// fakeHypervisor stands in for libvirt in unit tests of the cache's own logic: it echoes the
// domain it gets, with the name and UUID it picks, and counts calls. The cache's agreement
// with real libvirt is checked in test/defaults.
type fakeHypervisor struct {
	calls  int
	digest string
	err    error
	mangle func(string) string
}

func (f *fakeHypervisor) Machines() engine.Machines { return engine.Machines{"amd64": {"q35"}} }

func (f *fakeHypervisor) CapabilitiesDigest(context.Context) (string, error) { return f.digest, nil }

func (f *fakeHypervisor) DefineAndRead(_ context.Context, domain *libvirtxml.Domain) ([]byte, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	d := *domain
	d.Name, d.UUID = fmt.Sprintf("fake-%d", f.calls), fmt.Sprintf("00000000-0000-4000-8000-%012d", f.calls)
	out, err := d.Marshal()
	if err != nil {
		return nil, err
	}
	// libvirt writes attributes in single quotes and MACs in lower case.
	out = strings.ReplaceAll(out, `"`, `'`)
	if d.Devices != nil {
		for _, n := range d.Devices.Interfaces {
			if n.MAC != nil {
				out = strings.ReplaceAll(out, n.MAC.Address, strings.ToLower(n.MAC.Address))
			}
		}
	}
	if f.mangle != nil {
		out = f.mangle(out)
	}
	return []byte(out), nil
}

func nicDomain(memory uint, macs ...string) *libvirtxml.Domain {
	d := &libvirtxml.Domain{Type: "qemu", Memory: &libvirtxml.DomainMemory{Value: memory, Unit: "KiB"}, Devices: &libvirtxml.DomainDeviceList{}}
	for i, mac := range macs {
		iface := libvirtxml.DomainInterface{
			Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
			Alias:  &libvirtxml.DomainAlias{Name: fmt.Sprintf("ua-net%d", i)},
		}
		if mac != "" {
			iface.MAC = &libvirtxml.DomainInterfaceMAC{Address: mac}
		}
		d.Devices.Interfaces = append(d.Devices.Interfaces, iface)
	}
	return d
}

func macsOf(t *testing.T, answer []byte) []string {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(string(answer)); err != nil {
		t.Fatal(err)
	}
	var macs []string
	for _, n := range d.Devices.Interfaces {
		macs = append(macs, n.MAC.Address)
	}
	return macs
}

func TestCacheSameShapeDifferentIdentities(t *testing.T) {
	ctx := context.Background()
	f := &fakeHypervisor{digest: "a"}
	c, err := NewCache(ctx, f, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.DefineAndRead(ctx, nicDomain(1024, "02:00:00:00:00:01", "02:00:00:00:00:02"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.DefineAndRead(ctx, nicDomain(1024, "02:AA:00:00:00:03", "02:00:00:00:00:04"))
	if err != nil {
		t.Fatal(err)
	}
	if f.calls != 1 {
		t.Fatalf("the hypervisor was asked %d times for two domains of one shape, want 1", f.calls)
	}
	if got, want := macsOf(t, first), []string{"02:00:00:00:00:01", "02:00:00:00:00:02"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("first answer's MACs %v, want %v", got, want)
	}
	if got, want := macsOf(t, second), []string{"02:aa:00:00:00:03", "02:00:00:00:00:04"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("cached answer's MACs %v, want this request's, as libvirt writes them: %v", got, want)
	}
}

func TestCacheKeysOnWhatLibvirtCanSee(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		a, b *libvirtxml.Domain
	}{
		{"another shape", nicDomain(1024, "02:00:00:00:00:01"), nicDomain(2048, "02:00:00:00:00:01")},
		{"one MAC twice vs two MACs", nicDomain(1024, "02:00:00:00:00:01", "02:00:00:00:00:01"), nicDomain(1024, "02:00:00:00:00:01", "02:00:00:00:00:02")},
		{"another first octet (multicast bit)", nicDomain(1024, "02:00:00:00:00:01"), nicDomain(1024, "03:00:00:00:00:01")},
		{"more interfaces", nicDomain(1024, "02:00:00:00:00:01"), nicDomain(1024, "02:00:00:00:00:01", "02:00:00:00:00:02")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeHypervisor{}
			c, _ := NewCache(ctx, f, 8, nil)
			for _, d := range []*libvirtxml.Domain{tc.a, tc.b} {
				if _, err := c.DefineAndRead(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
			if f.calls != 2 || c.Len() != 2 {
				t.Errorf("asked libvirt %d times, kept %d answers; want 2 and 2: the domains differ in what libvirt sees", f.calls, c.Len())
			}
		})
	}
}

func TestCacheBypassesWhatItCannotNormalize(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		domain *libvirtxml.Domain
		mangle func(string) string
	}{
		{"an interface without a MAC: libvirt picks one", nicDomain(1024, ""), nil},
		{"a MAC not in canonical form", nicDomain(1024, "2:0:0:0:0:1"), nil},
		{"an answer with a MAC not asked for", nicDomain(1024, "02:00:00:00:00:01"), func(s string) string {
			return strings.Replace(s, "02:00:00:00:00:01", "52:54:00:12:34:56", 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeHypervisor{mangle: tc.mangle}
			c, _ := NewCache(ctx, f, 8, nil)
			for range 2 {
				if _, err := c.DefineAndRead(ctx, tc.domain); err != nil {
					t.Fatal(err)
				}
			}
			if f.calls != 2 || c.Len() != 0 {
				t.Errorf("asked libvirt %d times and kept %d answers, want 2 and 0", f.calls, c.Len())
			}
		})
	}
}

func TestCacheNeverKeepsErrors(t *testing.T) {
	ctx := context.Background()
	f := &fakeHypervisor{err: &RefusedError{Message: "no"}}
	c, _ := NewCache(ctx, f, 8, nil)
	for range 2 {
		var refused *RefusedError
		if _, err := c.DefineAndRead(ctx, nicDomain(1024, "02:00:00:00:00:01")); !errors.As(err, &refused) {
			t.Fatalf("error %v, want libvirt's refusal", err)
		}
	}
	if f.calls != 2 {
		t.Errorf("asked libvirt %d times, want 2", f.calls)
	}
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	f := &fakeHypervisor{}
	c, _ := NewCache(ctx, f, 2, nil)
	ask := func(mem uint) {
		t.Helper()
		if _, err := c.DefineAndRead(ctx, nicDomain(mem, "02:00:00:00:00:01")); err != nil {
			t.Fatal(err)
		}
	}
	ask(1) // miss
	ask(2) // miss
	ask(1) // hit: 2 is now the least recently used
	ask(3) // miss, evicts 2
	ask(1) // hit
	ask(2) // miss
	if f.calls != 4 || c.Len() != 2 {
		t.Errorf("asked libvirt %d times, %d answers kept; want 4 and 2", f.calls, c.Len())
	}
}

func TestCacheEmptiesWhenCapabilitiesChange(t *testing.T) {
	ctx := context.Background()
	f := &fakeHypervisor{digest: "qemu 7.2"}
	c, _ := NewCache(ctx, f, 8, nil)
	now := time.Unix(0, 0)
	c.now = func() time.Time { return now }
	c.checkedAt = now
	d := nicDomain(1024, "02:00:00:00:00:01")
	c.DefineAndRead(ctx, d)
	f.digest = "qemu 8.0"
	c.DefineAndRead(ctx, d)
	if f.calls != 1 {
		t.Fatalf("asked libvirt %d times, want 1: capabilities are checked at most every %v", f.calls, CapabilitiesCheckInterval)
	}
	now = now.Add(CapabilitiesCheckInterval)
	c.DefineAndRead(ctx, d)
	if f.calls != 2 {
		t.Errorf("asked libvirt %d times, want 2: the capabilities changed", f.calls)
	}
	now = now.Add(CapabilitiesCheckInterval)
	c.DefineAndRead(ctx, d)
	if f.calls != 2 {
		t.Errorf("asked libvirt %d times, want 2: the capabilities did not change again", f.calls)
	}
}

func TestCacheEpochChangesWithCapabilitiesAndDiffersBetweenCaches(t *testing.T) {
	ctx := context.Background()
	f := &fakeHypervisor{digest: "qemu 7.2"}
	c, _ := NewCache(ctx, f, 8, nil)
	other, _ := NewCache(ctx, f, 8, nil)
	if c.Epoch(ctx) == other.Epoch(ctx) {
		t.Errorf("two caches share epoch %d", c.Epoch(ctx))
	}
	now := time.Unix(0, 0)
	c.now = func() time.Time { return now }
	c.checkedAt = now
	first := c.Epoch(ctx)
	now = now.Add(CapabilitiesCheckInterval)
	if got := c.Epoch(ctx); got != first {
		t.Errorf("epoch %d, want %d: the capabilities did not change", got, first)
	}
	f.digest = "qemu 8.0"
	now = now.Add(CapabilitiesCheckInterval)
	if got := c.Epoch(ctx); got == first {
		t.Errorf("epoch still %d after the capabilities changed: Epoch checks them itself", got)
	}
}
