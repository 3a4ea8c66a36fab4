package defaults

import (
	"fmt"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/engine"
)

// domainOf renders the planned domain as libvirt domain XML structures. It has no name and
// no UUID: the hypervisor gives each request its own. The type is always qemu: defaults are
// the same as with kvm, which the throwaway libvirt may not have.
func domainOf(p *engine.PlannedDomain) (*libvirtxml.Domain, error) {
	d := &libvirtxml.Domain{
		Type:   "qemu",
		Memory: &libvirtxml.DomainMemory{Value: uint(p.MemoryKiB), Unit: "KiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: p.VCPUs},
		OS:     &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm", Arch: p.Arch, Machine: p.Machine}},
		CPU: &libvirtxml.DomainCPU{Topology: &libvirtxml.DomainCPUTopology{
			Sockets: int(p.Topology.Sockets), Dies: 1, Cores: int(p.Topology.Cores), Threads: int(p.Topology.Threads),
		}},
		Devices: &libvirtxml.DomainDeviceList{},
	}
	if p.VCPUsCurrent > 0 {
		// CPU hotplug: VCPUs possible, VCPUsCurrent enabled, those of the first socket fixed.
		d.VCPU.Current = p.VCPUsCurrent
		d.VCPUs = &libvirtxml.DomainVCPUs{}
		for id := range p.VCPUs {
			enabled, hotpluggable := "no", "no"
			if id < p.VCPUsCurrent {
				enabled = "yes"
			}
			if id >= p.VCPUsHotpluggableFrom {
				hotpluggable = "yes"
			}
			d.VCPUs.VCPU = append(d.VCPUs.VCPU, libvirtxml.DomainVCPUsVCPU{Id: &id, Enabled: enabled, Hotpluggable: hotpluggable})
		}
	}
	switch p.CPUModel {
	case "":
	case "host-model", "host-passthrough":
		d.CPU.Mode = p.CPUModel
	default:
		d.CPU.Mode = "custom"
		d.CPU.Model = &libvirtxml.DomainCPUModel{Value: p.CPUModel}
	}
	if p.Clock != nil {
		d.Clock = &libvirtxml.DomainClock{Offset: p.Clock.Offset, TimeZone: p.Clock.Timezone}
	}
	for i, c := range p.Controllers {
		index := c.Index
		d.Devices.Controllers = append(d.Devices.Controllers, libvirtxml.DomainController{
			Type: c.Type, Index: &index, Model: c.Model,
			Alias: &libvirtxml.DomainAlias{Name: fmt.Sprintf("ua-controller%d", i)},
		})
	}
	for _, k := range p.Disks {
		disk := libvirtxml.DomainDisk{
			Device: k.Device,
			Model:  k.Model,
			Target: &libvirtxml.DomainDiskTarget{Dev: k.Dev, Bus: k.Bus},
			Serial: k.Serial,
			Alias:  &libvirtxml.DomainAlias{Name: k.Alias},
		}
		switch k.Source.Type {
		case "file":
			disk.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: k.Source.Path}}
		case "block":
			disk.Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: k.Source.Path}}
		default:
			return nil, fmt.Errorf("disk %s: dummy source type %q: %w", k.Alias, k.Source.Type, engine.ErrMalformedInput)
		}
		if k.ReadOnly {
			disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		if k.BootOrder > 0 {
			disk.Boot = &libvirtxml.DomainDeviceBoot{Order: k.BootOrder}
		}
		if k.PCI != "" {
			a, err := pciAddress(k.PCI)
			if err != nil {
				return nil, fmt.Errorf("disk %s: %w", k.Alias, err)
			}
			disk.Address = a
		}
		d.Devices.Disks = append(d.Devices.Disks, disk)
	}
	for _, n := range p.Interfaces {
		if n.Source.Type != "ethernet" {
			return nil, fmt.Errorf("interface %s: dummy source type %q: %w", n.Alias, n.Source.Type, engine.ErrMalformedInput)
		}
		iface := libvirtxml.DomainInterface{
			Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
			MAC:    &libvirtxml.DomainInterfaceMAC{Address: n.MAC},
			Alias:  &libvirtxml.DomainAlias{Name: n.Alias},
		}
		if n.Model != "" {
			iface.Model = &libvirtxml.DomainInterfaceModel{Type: n.Model}
		}
		if n.BootOrder > 0 {
			iface.Boot = &libvirtxml.DomainDeviceBoot{Order: n.BootOrder}
		}
		if n.ROMDisabled {
			iface.ROM = &libvirtxml.DomainROM{Enabled: "no"}
		}
		if n.PCI != "" {
			a, err := pciAddress(n.PCI)
			if err != nil {
				return nil, fmt.Errorf("interface %s: %w", n.Alias, err)
			}
			iface.Address = a
		}
		d.Devices.Interfaces = append(d.Devices.Interfaces, iface)
	}
	for _, in := range p.Inputs {
		input := libvirtxml.DomainInput{Type: in.Type, Bus: in.Bus}
		if in.Alias != "" {
			// Without one: an input KubeVirt adds for the architecture, no field of the VM.
			input.Alias = &libvirtxml.DomainAlias{Name: in.Alias}
		}
		if in.Bus == "virtio" {
			input.Model = "virtio"
		}
		d.Devices.Inputs = append(d.Devices.Inputs, input)
	}
	if p.Memballoon != "" {
		d.Devices.MemBalloon = &libvirtxml.DomainMemBalloon{Model: p.Memballoon, FreePageReporting: p.MemballoonFreePageReporting}
	}
	if p.RNG {
		model := p.RNGModel
		if model == "" {
			model = "virtio"
		}
		d.Devices.RNGs = append(d.Devices.RNGs, libvirtxml.DomainRNG{
			Model:   model,
			Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}},
		})
	}
	if v := p.Video; v != nil {
		d.Devices.Videos = append(d.Devices.Videos, libvirtxml.DomainVideo{
			Model: libvirtxml.DomainVideoModel{Type: v.Model, VRam: v.VRAM, Heads: v.Heads},
		})
	}
	if p.SerialConsole {
		// A pty stands in for KubeVirt's unix socket: the guest sees the same serial port.
		port := uint(0)
		d.Devices.Serials = append(d.Devices.Serials, libvirtxml.DomainSerial{
			Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
			Target: &libvirtxml.DomainSerialTarget{Port: &port},
		})
		d.Devices.Consoles = append(d.Devices.Consoles, libvirtxml.DomainConsole{
			Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
			Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port},
		})
	}
	for _, name := range p.Channels {
		d.Devices.Channels = append(d.Devices.Channels, libvirtxml.DomainChannel{
			Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
			Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: name}},
		})
	}
	if w := p.Watchdog; w != nil {
		d.Devices.Watchdogs = append(d.Devices.Watchdogs, libvirtxml.DomainWatchdog{Model: w.Model, Action: w.Action})
	}
	if snd := p.Sound; snd != nil {
		d.Devices.Sounds = append(d.Devices.Sounds, libvirtxml.DomainSound{Model: snd.Model})
	}
	return d, nil
}

// pciAddress parses KubeVirt's 0000:01:00.0.
func pciAddress(s string) (*libvirtxml.DomainAddress, error) {
	dom, rest, ok1 := strings.Cut(s, ":")
	bus, rest, ok2 := strings.Cut(rest, ":")
	slot, fn, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 {
		return nil, fmt.Errorf("PCI address %q: %w", s, engine.ErrMalformedInput)
	}
	var vals [4]uint
	for i, part := range []string{dom, bus, slot, fn} {
		v, err := strconv.ParseUint(part, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("PCI address %q: %w", s, engine.ErrMalformedInput)
		}
		vals[i] = uint(v)
	}
	return &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{
		Domain: &vals[0], Bus: &vals[1], Slot: &vals[2], Function: &vals[3],
	}}, nil
}
