//go:build libvirt

package defaults_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
)

var _ = Describe("defaulting a VM with real libvirt", func() {
	It("fills in the seed's minimal VM: machine type, NIC model, MAC, PCI address, balloon, CPU, UUID", func() {
		vm, res := defaultVM(minimalVM)
		d := vm.Spec.Template.Spec.Domain
		Expect(d.Machine.Type).To(MatchRegexp(`^pc-i440fx-\d+\.\d+$`), "libvirt's default machine, expanded")
		nic := d.Devices.Interfaces[0]
		Expect(nic.Model).To(Equal("rtl8139"))
		Expect(nic.MacAddress).To(MatchRegexp(`^02(:[0-9a-f]{2}){5}$`))
		Expect(nic.PciAddress).To(Equal("0000:00:02.0"), "the first free slot on i440fx's root bus")
		Expect(nic.Masquerade).NotTo(BeNil(), "the binding is kept")
		Expect(*d.Devices.AutoattachMemBalloon).To(BeTrue())
		Expect(d.CPU.Sockets * d.CPU.Cores * d.CPU.Threads).To(BeEquivalentTo(1))
		Expect(d.CPU.Model).To(Equal("qemu64"))
		Expect(d.Clock.UTC).NotTo(BeNil())
		Expect(string(d.Firmware.UUID)).To(MatchRegexp(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`))
		Expect(d.Memory.Guest.String()).To(Equal("64Mi"))
		Expect(res.Defaults).To(ContainElements(
			"spec.template.spec.domain.machine.type",
			"spec.template.spec.domain.devices.interfaces[0].macAddress",
			"spec.template.spec.domain.devices.interfaces[0].pciAddress",
		))
	})

	It("lays devices out as the machine type does: q35 behind PCIe root ports, i440fx on the root bus", func() {
		q35, _ := defaultVM(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        machine: {type: q35}", 1))
		pc, _ := defaultVM(minimalVM)
		Expect(q35.Spec.Template.Spec.Domain.Machine.Type).To(Equal("q35"), "the user's alias is the user's value: kept")
		Expect(q35.Spec.Template.Spec.Domain.Devices.Interfaces[0].PciAddress).NotTo(HavePrefix("0000:00:"), "a conventional PCI NIC sits behind the pcie-to-pci bridge")
		Expect(pc.Spec.Template.Spec.Domain.Devices.Interfaces[0].PciAddress).To(HavePrefix("0000:00:"))
	})

	It("defaults disks on PVCs, DataVolumes and container disks, and a pod network, none of which exists", func() {
		vm, _ := defaultVM(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: disks, namespace: demo}
spec:
  template:
    spec:
      domain:
        machine: {type: q35}
        resources: {requests: {memory: 1Gi, cpu: "2"}}
        devices:
          disks:
          - {name: root, disk: {}}
          - {name: data}
          - {name: cloudinit, cdrom: {}}
          - {name: db, lun: {}}
          interfaces:
          - {name: default, masquerade: {}, model: virtio}
      networks:
      - {name: default, pod: {}}
      volumes:
      - {name: root, dataVolume: {name: does-not-exist}}
      - {name: data, persistentVolumeClaim: {claimName: does-not-exist-either}}
      - {name: cloudinit, cloudInitNoCloud: {userData: "#cloud-config"}}
      - {name: db, persistentVolumeClaim: {claimName: db}}
`)
		d := vm.Spec.Template.Spec.Domain
		disks := d.Devices.Disks
		Expect(disks[0].Disk.Bus).To(BeEquivalentTo("virtio"))
		Expect(disks[0].Disk.PciAddress).To(MatchRegexp(`^0000:0[1-9a-f]:00\.0$`), "a virtio disk behind a PCIe root port")
		Expect(disks[1].Disk.Bus).To(BeEquivalentTo("virtio"))
		Expect(disks[1].Disk.PciAddress).NotTo(Equal(disks[0].Disk.PciAddress))
		Expect(disks[2].CDRom.Bus).To(BeEquivalentTo("sata"))
		Expect(*disks[2].CDRom.ReadOnly).To(BeTrue())
		Expect(disks[3].LUN.Bus).To(BeEquivalentTo("scsi"))
		Expect(d.Memory.Guest.String()).To(Equal("1Gi"), "from the memory request")
		Expect(d.CPU.Sockets).To(BeEquivalentTo(2), "KubeVirt's topology from the CPU request")
		Expect(d.Devices.Interfaces[0].PciAddress).NotTo(BeElementOf(disks[0].Disk.PciAddress, disks[1].Disk.PciAddress))
	})

	It("is a fixed point: defaulting its own output changes nothing", func() {
		for _, doc := range []string{minimalVM, strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        machine: {type: q35}", 1)} {
			_, first := defaultVM(doc)
			again, err := defaulter.Default(ctx, first.Object)
			Expect(err).NotTo(HaveOccurred())
			Expect(again.Patch).To(BeEmpty())
			Expect(again.Object).To(MatchJSON(first.Object))
		}
	})

	It("is deterministic: the same input gives the same output, the same name the same MAC and UUID", func() {
		_, a := defaultVM(minimalVM)
		_, b := defaultVM(minimalVM)
		Expect(b.Object).To(Equal(a.Object))
		other, _ := defaultVM(strings.Replace(minimalVM, "name: testvm", "name: othervm", 1))
		first, _ := defaultVM(minimalVM)
		Expect(other.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress).NotTo(Equal(first.Spec.Template.Spec.Domain.Devices.Interfaces[0].MacAddress))
		Expect(other.Spec.Template.Spec.Domain.Firmware.UUID).NotTo(Equal(first.Spec.Template.Spec.Domain.Firmware.UUID))
	})

	It("gives a VM and the VMI started from it the same values", func() {
		vm, _ := defaultVM(minimalVM)
		vmi, err := defaulter.Default(ctx, vmJSON(`
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: testvm, namespace: demo}
spec:
  domain:
    devices:
      interfaces:
      - {name: default, masquerade: {}}
    memory: {guest: 64Mi}
  networks:
  - {name: default, pod: {}}
`))
		Expect(err).NotTo(HaveOccurred())
		got := &kubevirtv1.VirtualMachineInstance{}
		Expect(json.Unmarshal(vmi.Object, got)).To(Succeed())
		Expect(got.Spec.Domain).To(Equal(vm.Spec.Template.Spec.Domain))
	})

	It("never overrides what the user set", func() {
		vm, _ := defaultVM(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: pinned, namespace: demo}
spec:
  template:
    spec:
      domain:
        machine: {type: pc-q35-7.2}
        cpu: {cores: 2, model: Haswell}
        firmware: {uuid: 5d307ca9-b3ef-428c-8861-06e72d69f223}
        clock: {timezone: Europe/Berlin}
        memory: {guest: 100Mi}
        devices:
          autoattachMemBalloon: false
          interfaces:
          - {name: default, masquerade: {}, model: e1000e, macAddress: "02:00:00:00:00:42", pciAddress: "0000:05:00.0"}
      networks:
      - {name: default, pod: {}}
`)
		d := vm.Spec.Template.Spec.Domain
		Expect(d.Machine.Type).To(Equal("pc-q35-7.2"))
		Expect(d.CPU.Cores).To(BeEquivalentTo(2))
		Expect(d.CPU.Sockets).To(BeEquivalentTo(1))
		Expect(d.CPU.Model).To(Equal("Haswell"))
		Expect(string(d.Firmware.UUID)).To(Equal("5d307ca9-b3ef-428c-8861-06e72d69f223"))
		Expect(d.Clock.UTC).To(BeNil())
		Expect(d.Clock.Timezone).NotTo(BeNil())
		Expect(*d.Devices.AutoattachMemBalloon).To(BeFalse())
		Expect(d.Devices.Interfaces[0]).To(And(
			HaveField("Model", "e1000e"), HaveField("MacAddress", "02:00:00:00:00:42"), HaveField("PciAddress", "0000:05:00.0"),
		))
		Expect(d.Memory.Guest.String()).To(Equal("100Mi"))
	})

	It("never writes backend-only values: emulator, dummy sources, drivers, aliases, libvirt's name and UUID", func() {
		_, res := defaultVM(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: backend, namespace: demo}
spec:
  template:
    spec:
      domain:
        memory: {guest: 64Mi}
        devices:
          disks: [{name: root}]
          interfaces: [{name: default, masquerade: {}}]
      networks: [{name: default, pod: {}}]
      volumes: [{name: root, persistentVolumeClaim: {claimName: root}}]
`)
		text := string(res.Object)
		for _, backend := range []string{"qemu-system", "/usr/bin", "virt-rules-dummy", "ua-", "virt-rules-", `"raw"`, "ethernet", "emulator", "driver", "alias", "source"} {
			Expect(text).NotTo(ContainSubstring(backend))
		}
	})

	It("defaults concurrent requests for the same VM alike, each domain under its own name", func() {
		_, want := defaultVM(minimalVM)
		var wg sync.WaitGroup
		results := make([][]byte, 8)
		errs := make([]error, 8)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := defaulter.Default(ctx, vmJSON(minimalVM))
				errs[i] = err
				if err == nil {
					results[i] = res.Object
				}
			}()
		}
		wg.Wait()
		Expect(errors.Join(errs...)).NotTo(HaveOccurred())
		for _, r := range results {
			Expect(r).To(Equal(want.Object))
		}
	})
})

var _ = Describe("bad input", func() {
	invalid := func(doc string) *defaults.InvalidError {
		GinkgoHelper()
		_, err := defaulter.Default(ctx, vmJSON(doc))
		var inv *defaults.InvalidError
		Expect(errors.As(err, &inv)).To(BeTrue(), "%v", err)
		return inv
	}
	fields := func(e *defaults.InvalidError) []string {
		var out []string
		for _, c := range e.Causes {
			out = append(out, c.Field)
		}
		return out
	}

	It("names the field of a VM without memory", func() {
		e := invalid(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "", 1))
		Expect(e.Error()).To(HavePrefix("VirtualMachine demo/testvm: "))
		Expect(fields(e)).To(Equal([]string{"spec.template.spec.domain.memory.guest"}))
	})

	It("names the field of a value of the wrong type", func() {
		e := invalid(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        cpu: {cores: two}", 1))
		Expect(fields(e)).To(Equal([]string{"spec.template.spec.domain.cpu.cores"}))
	})

	It("names the fields libvirt refuses, with libvirt's message", func() {
		e := invalid(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: clash, namespace: demo}
spec:
  template:
    spec:
      domain:
        memory: {guest: 64Mi}
        devices:
          interfaces:
          - {name: a, masquerade: {}, model: virtio, pciAddress: "0000:00:07.0"}
          - {name: b, bridge: {}, model: virtio, pciAddress: "0000:00:07.0"}
      networks: [{name: a, pod: {}}, {name: b, multus: {networkName: x}}]
`)
		Expect(e.Libvirt).To(ContainSubstring("0000:00:07.0"))
		Expect(fields(e)).To(Equal([]string{
			"spec.template.spec.domain.devices.interfaces[0].pciAddress",
			"spec.template.spec.domain.devices.interfaces[1].pciAddress",
		}))
	})

	It("says a machine type QEMU lacks is unsupported, listing what it has", func() {
		e := invalid(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        machine: {type: pc-q35-1.0}", 1))
		Expect(fields(e)).To(Equal([]string{"spec.template.spec.domain.machine.type"}))
		Expect(e.Causes[0].Message).To(ContainSubstring("pc-q35-"))
	})

	It("marks an SR-IOV interface unsupported, not invalid", func() {
		e := invalid(strings.Replace(strings.Replace(minimalVM, "masquerade: {}", "sriov: {}", 1), "pod: {}", "multus: {networkName: vf}", 1))
		Expect(e.Unsupported()).To(BeTrue())
		Expect(fields(e)).To(Equal([]string{"spec.template.spec.domain.devices.interfaces[0].sriov"}))
	})

	It("refuses what is no VM, without a panic", func() {
		for _, body := range []string{"", "[]", "{", `{"apiVersion":"v1","kind":"Pod"}`, `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine"}`, `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","spec":{"template":{"spec":7}}}`} {
			_, err := defaulter.Default(ctx, []byte(body))
			Expect(err).To(HaveOccurred(), body)
		}
	})

	It("reports libvirt that cannot start as unavailable", func() {
		_, err := defaults.OpenLibvirt(ctx, "/proc/virt-rules-cannot-be-here", nil)
		Expect(err).To(MatchError(defaults.ErrUnavailable))
		Expect(err.Error()).To(ContainSubstring("/proc/virt-rules-cannot-be-here"))
	})
})

var _ = Describe("the defaulter HTTP service", func() {
	post := func(url string, body []byte) (int, []byte, http.Header) {
		GinkgoHelper()
		resp, err := http.Post(url, "application/json", bytes.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		return resp.StatusCode, out, resp.Header
	}
	status := func(body []byte) metav1.Status {
		GinkgoHelper()
		var s metav1.Status
		Expect(json.Unmarshal(body, &s)).To(Succeed(), string(body))
		return s
	}

	It("returns the whole VM defaulted, or with ?dryRun=true the JSON patch that gives it", func() {
		code, full, _ := post(server.URL+defaults.Path, vmJSON(minimalVM))
		Expect(code).To(Equal(http.StatusOK), string(full))
		_, want := defaultVM(minimalVM)
		Expect(full).To(MatchJSON(want.Object))

		code, patchBody, header := post(server.URL+defaults.Path+"?dryRun=true", vmJSON(minimalVM))
		Expect(code).To(Equal(http.StatusOK), string(patchBody))
		Expect(header.Get("Content-Type")).To(Equal("application/json-patch+json"))
		patch, err := jsonpatch.DecodePatch(patchBody)
		Expect(err).NotTo(HaveOccurred())
		patched, err := patch.Apply(vmJSON(minimalVM))
		Expect(err).NotTo(HaveOccurred())
		Expect(patched).To(MatchJSON(full))

		code, again, _ := post(server.URL+defaults.Path+"?dryRun=true", full)
		Expect(code).To(Equal(http.StatusOK))
		Expect(again).To(MatchJSON(`[]`), "nothing left to default")
	})

	It("answers 400 for what is no VM and 422 with every field at fault", func() {
		code, body, _ := post(server.URL+defaults.Path, []byte(`{"kind":"Pod","apiVersion":"v1"}`))
		Expect(code).To(Equal(http.StatusBadRequest))
		Expect(status(body).Message).To(ContainSubstring(`kind "Pod"`))

		code, body, _ = post(server.URL+defaults.Path, vmJSON(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        machine: {type: nope}", 1)))
		Expect(code).To(Equal(http.StatusUnprocessableEntity))
		s := status(body)
		Expect(s.Reason).To(Equal(metav1.StatusReasonInvalid))
		Expect(s.Details.Causes).To(ConsistOf(HaveField("Field", "spec.template.spec.domain.machine.type")))
		Expect(s.Message).To(HavePrefix("VirtualMachine demo/testvm: spec.template.spec.domain.machine.type: "))
	})

	It("is healthy at once, ready only with libvirt probed, and 503 until then", func() {
		eng, err := engine.New(ctx)
		Expect(err).NotTo(HaveOccurred())
		cold := defaults.NewService(eng, nil)
		for _, s := range []http.Handler{cold, service} {
			rec := httptestRecorder(s, "GET", "/healthz")
			Expect(rec).To(Equal(http.StatusOK))
		}
		Expect(httptestRecorder(cold, "GET", "/readyz")).To(Equal(http.StatusServiceUnavailable))
		Expect(httptestRecorder(service, "GET", "/readyz")).To(Equal(http.StatusOK))
		Expect(httptestRecorderBody(cold, "POST", defaults.Path, vmJSON(minimalVM))).To(HaveKeyWithValue(http.StatusServiceUnavailable, ContainSubstring("libvirt unavailable")))
	})

	It("exports its request latency, and measures it", func() {
		var lat []time.Duration
		for range 200 {
			start := time.Now()
			code, _, _ := post(server.URL+defaults.Path+"?dryRun=true", vmJSON(minimalVM))
			lat = append(lat, time.Since(start))
			Expect(code).To(Equal(http.StatusOK))
		}
		slices.Sort(lat)
		AddReportEntry("HTTP request latency, 1 client, 200 requests", fmt.Sprintf("p50 %v p99 %v", lat[len(lat)/2], lat[len(lat)*99/100]))
		resp, err := http.Get(server.URL + "/metrics")
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		metrics, _ := io.ReadAll(resp.Body)
		Expect(string(metrics)).To(ContainSubstring(`virtrules_defaults_request_duration_seconds_count{code="200",dry_run="true"}`))
		Expect(string(metrics)).To(ContainSubstring(`virtrules_defaults_libvirt_duration_seconds_bucket`))
	})
})
