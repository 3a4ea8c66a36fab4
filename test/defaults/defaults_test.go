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
	It("fills in the seed's minimal VM as KubeVirt builds it: machine type, NIC model, MAC, PCI address, balloon, CPU, architecture, UUID", func() {
		vm, res := defaultVM(minimalVM)
		spec := vm.Spec.Template.Spec
		d := spec.Domain
		Expect(d.Machine.Type).To(Equal("q35"), "KubeVirt's default machine alias, not libvirt's pc-i440fx")
		Expect(spec.Architecture).To(Equal("amd64"))
		nic := d.Devices.Interfaces[0]
		Expect(nic.Model).To(Equal("virtio"))
		Expect(nic.MacAddress).To(MatchRegexp(`^02(:[0-9a-f]{2}){5}$`))
		Expect(nic.PciAddress).To(Equal("0000:01:00.0"), "a PCIe device behind q35's first root port")
		Expect(nic.Masquerade).NotTo(BeNil(), "the binding is kept")
		Expect(*d.Devices.AutoattachMemBalloon).To(BeTrue())
		Expect(*d.CPU).To(Equal(kubevirtv1.CPU{Model: "host-model", Sockets: 1, Cores: 1, Threads: 1, MaxSockets: 4}), "KubeVirt's topology, with room to hotplug sockets")
		Expect(d.Clock).To(BeNil(), "KubeVirt writes no clock")
		Expect(string(d.Firmware.UUID)).To(MatchRegexp(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), "a version-8 UUID")
		Expect(d.Memory.Guest.String()).To(Equal("64Mi"))
		Expect(d.Memory.MaxGuest).To(BeNil(), "no memory hotplug below 1Gi")
		Expect(res.Defaults).To(ConsistOf(
			"spec.template.spec.architecture",
			"spec.template.spec.domain.cpu.cores",
			"spec.template.spec.domain.cpu.maxSockets",
			"spec.template.spec.domain.cpu.model",
			"spec.template.spec.domain.cpu.sockets",
			"spec.template.spec.domain.cpu.threads",
			"spec.template.spec.domain.devices.autoattachMemBalloon",
			"spec.template.spec.domain.devices.interfaces[0].macAddress",
			"spec.template.spec.domain.devices.interfaces[0].model",
			"spec.template.spec.domain.devices.interfaces[0].pciAddress",
			"spec.template.spec.domain.firmware.uuid",
			"spec.template.spec.domain.machine.type",
		))
	})

	It("lays devices out as the machine type does: on q35 (the default) behind PCIe root ports, on a user's i440fx on the root bus", func() {
		q35, _ := defaultVM(minimalVM)
		pc, _ := defaultVM(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        machine: {type: pc}", 1))
		Expect(pc.Spec.Template.Spec.Domain.Machine.Type).To(Equal("pc"), "the user's alias is the user's value: kept")
		Expect(q35.Spec.Template.Spec.Domain.Devices.Interfaces[0].PciAddress).To(Equal("0000:01:00.0"), "a virtio NIC behind a PCIe root port")
		Expect(pc.Spec.Template.Spec.Domain.Devices.Interfaces[0].PciAddress).To(Equal("0000:00:03.0"), "on i440fx's root bus")
		legacy, _ := defaultVM(strings.Replace(minimalVM, "masquerade: {}}", "masquerade: {}, model: rtl8139}", 1))
		Expect(legacy.Spec.Template.Spec.Domain.Devices.Interfaces[0].PciAddress).To(Equal("0000:02:01.0"), "a conventional PCI NIC on q35 sits behind the pcie-to-pci bridge")
	})

	It("defaults disks on PVCs, DataVolumes and cloud-init, and a pod network, none of which exists; disk buses to SATA as KubeVirt does on amd64", func() {
		disksVM := vmDoc("disks", `
      domain:
        machine: {type: q35}
        resources: {requests: {memory: 1Gi, cpu: "2"}}
        devices:
          disks:
          - {name: root, disk: {bus: virtio}}
          - {name: data}
          - {name: data2, disk: {bus: virtio}}
          - {name: cloudinit, cdrom: {}}
          - {name: db, lun: {bus: scsi}}
          interfaces:
          - {name: default, masquerade: {}, model: virtio}
      networks:
      - {name: default, pod: {}}
      volumes:
      - {name: root, dataVolume: {name: does-not-exist}}
      - {name: data, persistentVolumeClaim: {claimName: does-not-exist-either}}
      - {name: data2, persistentVolumeClaim: {claimName: nor-this-one}}
      - {name: cloudinit, cloudInitNoCloud: {userData: "#cloud-config"}}
      - {name: db, persistentVolumeClaim: {claimName: db}}`)
		vm, _ := defaultVM(disksVM)
		d := vm.Spec.Template.Spec.Domain
		disks := d.Devices.Disks
		Expect(disks[0].Disk.Bus).To(BeEquivalentTo("virtio"))
		Expect(disks[0].Disk.PciAddress).To(Equal("0000:07:00.0"), "a virtio disk behind a PCIe root port")
		Expect(disks[1].Disk).NotTo(BeNil(), "a disk with no target is a disk")
		Expect(disks[1].Disk.Bus).To(BeEquivalentTo("sata"), "KubeVirt's default bus on amd64")
		Expect(disks[1].Disk.PciAddress).To(BeEmpty(), "a SATA disk has no PCI address of its own")
		Expect(disks[2].Disk.Bus).To(BeEquivalentTo("virtio"))
		Expect(disks[2].Disk.PciAddress).To(Equal("0000:08:00.0"))
		Expect(disks[3].CDRom.Bus).To(BeEquivalentTo("sata"))
		Expect(*disks[3].CDRom.ReadOnly).To(BeTrue())
		Expect(disks[4].LUN.Bus).To(BeEquivalentTo("scsi"), "the user's bus: libvirt has no LUN on SATA")
		Expect(d.Memory.Guest.String()).To(Equal("1Gi"), "from the memory request")
		Expect(d.Memory.MaxGuest.String()).To(Equal("4Gi"), "KubeVirt's memory hotplug ceiling")
		Expect(d.CPU.Sockets).To(BeEquivalentTo(2), "KubeVirt's topology from the CPU request")
		Expect(d.CPU.MaxSockets).To(BeEquivalentTo(8))
		Expect(d.Devices.Interfaces[0].PciAddress).To(Equal("0000:01:00.0"))

		// A LUN left to KubeVirt's default bus is SATA, where libvirt has no LUN: refused, naming it.
		_, err := defaulter.Default(ctx, vmJSON(strings.Replace(disksVM, "lun: {bus: scsi}", "lun: {}", 1)))
		var inv *defaults.InvalidError
		Expect(errors.As(err, &inv)).To(BeTrue(), "%v", err)
		Expect(inv.Causes).To(ConsistOf(And(
			HaveField("Field", "spec.template.spec.domain.devices.disks[4].lun.bus"),
			HaveField("Message", ContainSubstring("set bus: scsi")),
		)))
	})

	It("is a fixed point: defaulting its own output changes nothing", func() {
		for _, doc := range []string{minimalVM, strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        machine: {type: pc}", 1)} {
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
		vmi, err := defaulter.Default(ctx, vmiOf(minimalVM))
		Expect(err).NotTo(HaveOccurred())
		got := &kubevirtv1.VirtualMachineInstance{}
		Expect(json.Unmarshal(vmi.Object, got)).To(Succeed())
		Expect(got.Spec.Domain).To(Equal(vm.Spec.Template.Spec.Domain))
	})

	It("never overrides what the user set", func() {
		vm, res := defaultVM(vmDoc("pinned", `
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
      - {name: default, pod: {}}`))
		d := vm.Spec.Template.Spec.Domain
		Expect(d.Machine.Type).To(Equal("pc-q35-7.2"))
		Expect(*d.CPU).To(Equal(kubevirtv1.CPU{Cores: 2, Model: "Haswell"}), "KubeVirt completes no topology the user began")
		Expect(string(d.Firmware.UUID)).To(Equal("5d307ca9-b3ef-428c-8861-06e72d69f223"))
		Expect(d.Clock.UTC).To(BeNil())
		Expect(*d.Clock.Timezone).To(BeEquivalentTo("Europe/Berlin"))
		Expect(*d.Devices.AutoattachMemBalloon).To(BeFalse())
		Expect(d.Devices.Interfaces[0]).To(And(
			HaveField("Model", "e1000e"), HaveField("MacAddress", "02:00:00:00:00:42"), HaveField("PciAddress", "0000:05:00.0"),
		))
		Expect(d.Memory.Guest.String()).To(Equal("100Mi"))
		Expect(res.Defaults).To(Equal([]string{"spec.template.spec.architecture"}), "nothing else was left to default")
	})

	It("never writes backend-only values: emulator, dummy sources, drivers, aliases, libvirt's name and UUID", func() {
		_, res := defaultVM(vmDoc("backend", `
      domain:
        memory: {guest: 64Mi}
        devices:
          disks: [{name: root}]
          interfaces: [{name: default, masquerade: {}}]
      networks: [{name: default, pod: {}}]
      volumes: [{name: root, persistentVolumeClaim: {claimName: root}}]`))
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

	It("names the field of a quantity that does not parse, and of memory no guest can have", func() {
		e := invalid(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "resources: {requests: {memory: lots}}", 1))
		Expect(fields(e)).To(Equal([]string{"spec.template.spec.domain.resources.requests.memory"}))
		Expect(e.Causes[0].Message).To(ContainSubstring(`"lots" is not a quantity`))
		e = invalid(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 999999Ei}", 1))
		Expect(fields(e)).To(Equal([]string{"spec.template.spec.domain.memory.guest"}))
		Expect(e.Causes[0].Message).To(ContainSubstring("at most 8Ei"))
	})

	It("names the field of a value of the wrong type", func() {
		e := invalid(strings.Replace(minimalVM, "memory: {guest: 64Mi}", "memory: {guest: 64Mi}\n        cpu: {cores: two}", 1))
		Expect(fields(e)).To(Equal([]string{"spec.template.spec.domain.cpu.cores"}))
	})

	It("names the fields libvirt refuses, with libvirt's message", func() {
		e := invalid(vmDoc("clash", `
      domain:
        memory: {guest: 64Mi}
        devices:
          interfaces:
          - {name: a, masquerade: {}, model: virtio, pciAddress: "0000:00:07.0"}
          - {name: b, bridge: {}, model: virtio, pciAddress: "0000:00:07.0"}
      networks: [{name: a, pod: {}}, {name: b, multus: {networkName: x}}]`))
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

	It("defaults a VM with an SR-IOV interface but the VF, warning of each value left to the node", func() {
		doc := strings.Replace(minimalVM, "- {name: default, masquerade: {}}", "- {name: default, masquerade: {}}\n          - {name: vf, sriov: {}}", 1)
		doc = strings.Replace(doc, "- {name: default, pod: {}}", "- {name: default, pod: {}}\n      - {name: vf, multus: {networkName: sriov}}", 1)
		vm, res := defaultVM(doc)
		Expect(res.Warnings).To(ConsistOf(
			HavePrefix("spec.template.spec.domain.devices.interfaces[1].macAddress: an SR-IOV VF gets its MAC from the SR-IOV CNI"),
			HavePrefix("spec.template.spec.domain.devices.interfaces[1].pciAddress: an SR-IOV VF is a host device"),
		))
		ifaces := vm.Spec.Template.Spec.Domain.Devices.Interfaces
		Expect(ifaces[0].PciAddress).To(Equal("0000:01:00.0"), "the pod NIC is defaulted, before any host device")
		Expect(ifaces[1]).To(And(HaveField("PciAddress", ""), HaveField("MacAddress", ""), HaveField("Model", "")))
		Expect(res.Defaults).NotTo(ContainElement(HavePrefix("spec.template.spec.domain.devices.interfaces[1]")))

		pinned := strings.Replace(doc, "{name: vf, sriov: {}}", `{name: vf, sriov: {}, pciAddress: "0000:09:00.0", macAddress: "02:00:00:00:00:09"}`, 1)
		_, res = defaultVM(pinned)
		Expect(res.Warnings).To(BeEmpty(), "nothing left to the node once the user pinned it")
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

	It("takes a DefaultsRequest: the object with its cluster's KubeVirt CR and its namespace's UID", func() {
		envelope := func(kubevirt map[string]any, namespaceUID string) []byte {
			GinkgoHelper()
			b, err := json.Marshal(defaults.Request{
				APIVersion: defaults.RequestAPIVersion, Kind: defaults.RequestKind,
				Object: vmJSON(minimalVM), KubeVirt: kubevirt, NamespaceUID: namespaceUID,
			})
			Expect(err).NotTo(HaveOccurred())
			return b
		}
		decode := func(body []byte) *kubevirtv1.VirtualMachine {
			GinkgoHelper()
			vm := &kubevirtv1.VirtualMachine{}
			Expect(json.Unmarshal(body, vm)).To(Succeed(), string(body))
			return vm
		}
		_, plain, _ := post(server.URL+defaults.Path, vmJSON(minimalVM))
		code, same, _ := post(server.URL+defaults.Path, envelope(nil, ""))
		Expect(code).To(Equal(http.StatusOK), string(same))
		Expect(same).To(MatchJSON(plain), "no cluster, no UID: the bare object's answer")

		kubevirt := map[string]any{"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "spec": map[string]any{"configuration": map[string]any{"cpuModel": "Haswell-noTSX"}}}
		code, body, _ := post(server.URL+defaults.Path, envelope(kubevirt, ""))
		Expect(code).To(Equal(http.StatusOK), string(body))
		Expect(decode(body).Spec.Template.Spec.Domain.CPU.Model).To(Equal("Haswell-noTSX"), "the cluster's CPU model")

		base := decode(plain).Spec.Template.Spec.Domain
		uids := map[string]string{}
		for _, uid := range []string{"9f5e1c2a-0000-4000-8000-000000000001", "9f5e1c2a-0000-4000-8000-000000000002"} {
			code, body, _ := post(server.URL+defaults.Path, envelope(nil, uid))
			Expect(code).To(Equal(http.StatusOK), string(body))
			d := decode(body).Spec.Template.Spec.Domain
			Expect(d.Firmware.UUID).NotTo(Equal(base.Firmware.UUID), "derived from the namespace's UID, not its name")
			Expect(d.Devices.Interfaces[0].MacAddress).NotTo(Equal(base.Devices.Interfaces[0].MacAddress))
			uids[string(d.Firmware.UUID)] = uid
		}
		Expect(uids).To(HaveLen(2), "two clusters' namespaces, two identities")

		code, body, _ = post(server.URL+defaults.Path, []byte(`{"kind":"DefaultsRequest","apiVersion":"v9","object":{}}`))
		Expect(code).To(Equal(http.StatusBadRequest))
		Expect(status(body).Message).To(ContainSubstring(`apiVersion "v9": want defaults.virt-rules.io/v1alpha1`))
	})

	It("sends what it leaves to the node as Warning headers", func() {
		doc := strings.Replace(minimalVM, "- {name: default, masquerade: {}}", "- {name: default, masquerade: {}}\n          - {name: vf, sriov: {}}", 1)
		doc = strings.Replace(doc, "- {name: default, pod: {}}", "- {name: default, pod: {}}\n      - {name: vf, multus: {networkName: sriov}}", 1)
		code, body, header := post(server.URL+defaults.Path+"?dryRun=true", vmJSON(doc))
		Expect(code).To(Equal(http.StatusOK), string(body))
		Expect(header.Values("Warning")).To(ConsistOf(
			HavePrefix(`299 - "spec.template.spec.domain.devices.interfaces[1].macAddress: `),
			HavePrefix(`299 - "spec.template.spec.domain.devices.interfaces[1].pciAddress: `),
		))
		_, _, header = post(server.URL+defaults.Path+"?dryRun=true", vmJSON(minimalVM))
		Expect(header.Values("Warning")).To(BeEmpty())
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
