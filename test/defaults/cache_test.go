//go:build libvirt

package defaults_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"libvirt.org/go/libvirtxml"

	"github.com/virt-rules/virt-rules/defaults"
)

// recorder remembers the last domain asked and libvirt's answer.
type recorder struct {
	defaults.Hypervisor
	mu     sync.Mutex
	domain *libvirtxml.Domain
	answer []byte
	calls  int
}

func (r *recorder) DefineAndRead(ctx context.Context, d *libvirtxml.Domain) ([]byte, error) {
	out, err := r.Hypervisor.DefineAndRead(ctx, d)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.domain, r.answer = d, out
	r.calls++
	return out, err
}

// perRequest is what libvirt makes up per domain: its name and UUID.
var perRequest = regexp.MustCompile(`<name>[^<]*</name>|<uuid>[^<]*</uuid>`)

// Shapes of VMs: KubeVirt's default machine type and explicit ones, disks on every bus, several
// NICs with and without models, user MACs and PCI addresses, inputs, no balloon, an RNG, CPU
// topologies.
var shapes = map[string]string{
	"minimal, on KubeVirt's default q35": `
      domain:
        memory: {guest: 64Mi}
        devices:
          interfaces: [{name: default, masquerade: {}}]
      networks: [{name: default, pod: {}}]`,
	"q35 with disks on every bus": `
      domain:
        machine: {type: q35}
        resources: {requests: {memory: 1Gi, cpu: "2"}}
        devices:
          disks:
          - {name: root, disk: {bus: virtio}}
          - {name: data, disk: {}}
          - {name: cloudinit, cdrom: {}}
          - {name: db, lun: {bus: scsi}}
          - {name: usb, disk: {bus: usb}}
          interfaces: [{name: default, masquerade: {}, model: virtio}]
      networks: [{name: default, pod: {}}]
      volumes:
      - {name: root, dataVolume: {name: r}}
      - {name: data, persistentVolumeClaim: {claimName: d}}
      - {name: cloudinit, cloudInitNoCloud: {userData: "#cloud-config"}}
      - {name: db, persistentVolumeClaim: {claimName: db}}
      - {name: usb, containerDisk: {image: x}}`,
	"three NICs, one with the user's MAC, one with the user's PCI address": `
      domain:
        machine: {type: q35}
        memory: {guest: 512Mi}
        cpu: {sockets: 2, cores: 2, threads: 1}
        devices:
          interfaces:
          - {name: default, masquerade: {}}
          - {name: second, bridge: {}, model: e1000e, macAddress: "02:AB:CD:00:00:07"}
          - {name: third, bridge: {}, model: virtio, pciAddress: "0000:08:00.0"}
      networks:
      - {name: default, pod: {}}
      - {name: second, multus: {networkName: n2}}
      - {name: third, multus: {networkName: n3}}`,
	"i440fx, inputs, no balloon, an RNG, a clock": `
      domain:
        machine: {type: pc}
        memory: {guest: 128Mi}
        clock: {timezone: Europe/Berlin}
        devices:
          autoattachMemBalloon: false
          rng: {}
          inputs: [{name: tablet, type: tablet, bus: usb}]
          disks: [{name: root, disk: {bus: sata}}]
          interfaces: [{name: a, masquerade: {}, model: virtio}, {name: b, bridge: {}}]
      networks: [{name: a, pod: {}}, {name: b, multus: {networkName: b}}]
      volumes: [{name: root, containerDisk: {image: x}}]`,
}

func vmOfShape(name, spec string) []byte {
	return vmJSON(vmDoc(name, spec))
}

var _ = Describe("the libvirt answer cache", func() {
	It("answers VMs of one shape as fresh libvirt does, whatever their MACs, UUIDs and names", func() {
		for shape, spec := range shapes {
			By(shape)
			fresh := &recorder{Hypervisor: lv}
			behind := &recorder{Hypervisor: lv}
			cache, err := defaults.NewCache(ctx, behind, 16, nil)
			Expect(err).NotTo(HaveOccurred())
			cached := &recorder{Hypervisor: cache}
			viaCache := &defaults.Defaulter{Engine: defaulter.Engine, Hypervisor: cached}
			viaLibvirt := &defaults.Defaulter{Engine: defaulter.Engine, Hypervisor: fresh}

			// The first VM fills the cache; every other is answered from it.
			_, err = viaCache.Default(ctx, vmOfShape("first", spec))
			Expect(err).NotTo(HaveOccurred())
			Expect(cache.Len()).To(Equal(1), "a domain of this shape is cacheable")
			for i := range 3 {
				vm := vmOfShape(fmt.Sprintf("vm-%d", i), spec)
				got, err := viaCache.Default(ctx, vm)
				Expect(err).NotTo(HaveOccurred())
				want, err := viaLibvirt.Default(ctx, vm)
				Expect(err).NotTo(HaveOccurred())
				Expect(string(got.Object)).To(Equal(string(want.Object)), "the defaulted VM")
				Expect(got.Defaults).To(Equal(want.Defaults))
				Expect(perRequest.ReplaceAllString(string(cached.answer), "")).
					To(Equal(perRequest.ReplaceAllString(string(fresh.answer), "")), "libvirt's whole answer but its name and UUID")
			}
			Expect(cache.Len()).To(Equal(1), "one shape, one answer")
			Expect(behind.calls).To(Equal(1), "libvirt asked once, for the first VM")
		}
	})

	It("gives domains that differ only in MACs, name and UUID the same answer from libvirt itself", func() {
		// The normalization's premise, asked of libvirt: random MACs, names and UUIDs change
		// nothing else libvirt chooses.
		for shape, spec := range shapes {
			By(shape)
			rec := &recorder{Hypervisor: lv}
			d := &defaults.Defaulter{Engine: defaulter.Engine, Hypervisor: rec}
			_, err := d.Default(ctx, vmOfShape("premise", spec))
			Expect(err).NotTo(HaveOccurred())
			base := *rec.domain
			var answers []string
			for i := range 4 {
				dom := base
				devices := *base.Devices
				devices.Interfaces = nil
				for j, iface := range base.Devices.Interfaces {
					mac := *iface.MAC
					mac.Address = fmt.Sprintf("02:%02x:%02x:00:%02x:%02x", 17*i+j, 3*i, j, i)
					iface.MAC = &mac
					devices.Interfaces = append(devices.Interfaces, iface)
				}
				dom.Devices = &devices
				out, err := lv.DefineAndRead(ctx, &dom)
				Expect(err).NotTo(HaveOccurred())
				s := perRequest.ReplaceAllString(string(out), "")
				for _, iface := range devices.Interfaces {
					s = strings.ReplaceAll(s, iface.MAC.Address, "MAC")
				}
				answers = append(answers, s)
			}
			for _, a := range answers[1:] {
				Expect(a).To(Equal(answers[0]))
			}
		}
	})
})
