//go:build libvirt

package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("default", Ordered, func() {
	// One libvirt root for the specs: QEMU's capabilities are probed once and cached there.
	var root string

	BeforeAll(func() {
		var err error
		root, err = os.MkdirTemp("/dev/shm", "virt-rules-cli-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, root)
	})

	golden := filepath.Join("examples", "defaults", "default.golden.out")

	It("defaults examples/defaults as default.golden.out says", func() {
		r := run("", "default", "--libvirt-root", root, "-f", "examples/defaults/")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		if os.Getenv("UPDATE_GOLDEN") == "1" {
			Expect(os.WriteFile(filepath.Join(repoRoot, golden), []byte(r.stdout), 0o644)).To(Succeed())
		}
		want, err := os.ReadFile(filepath.Join(repoRoot, golden))
		Expect(err).NotTo(HaveOccurred())
		Expect(r.stdout).To(Equal(string(want)))
	})

	It("is a fixed point: its own output defaults to itself, with an empty patch", func() {
		again := run("", "default", "--libvirt-root", root, "-f", golden)
		Expect(again.exitCode).To(Equal(0), again.stderr)
		want, _ := os.ReadFile(filepath.Join(repoRoot, golden))
		Expect(again.stdout).To(Equal(string(want)))
		patch := run("", "default", "--libvirt-root", root, "--patch", "-o", "json", "-f", golden)
		Expect(patch.exitCode).To(Equal(0), patch.stderr)
		// Two instancetype and preference objects, printed as they are, and four VMs and VMIs.
		Expect(strings.Fields(patch.stdout)).To(Equal([]string{"[]", "[]", "[]", "[]", "[]", "[]"}))
	})

	It("prints the JSON patch with --patch, reading stdin", func() {
		vm, err := os.ReadFile(filepath.Join(repoRoot, "examples", "defaults", "vm.yaml"))
		Expect(err).NotTo(HaveOccurred())
		r := run(string(vm), "default", "--libvirt-root", root, "--patch", "-o", "json", "-f", "-")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring(`"path": "/spec/template/spec/domain/machine"`))
	})

	It("names the file, the line, the object and the field of bad input, defaults the rest, and exits 1", func() {
		bad := writeTemp("bad.yaml", vmDoc("nomem", "devices: {}")+`---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
---
`+vmiDoc("fine", `
  domain:
    devices: {}
    memory: {guest: 128Mi}`))
		r := run("", "default", "--libvirt-root", root, "-f", bad)
		Expect(r.exitCode).To(Equal(1), r.stderr)
		// The field's parent is the deepest one the text has: domain, line 7.
		Expect(r.stderr).To(ContainSubstring("error: " + bad + ":7: VirtualMachine demo/nomem: spec.template.spec.domain.memory.guest: the guest needs memory"))
		Expect(r.stderr).To(ContainSubstring("error: " + bad + ":11: ConfigMap cm: kind: only VirtualMachines and VirtualMachineInstances are defaulted"))
		Expect(r.stderr).To(ContainSubstring("2 objects in error, 2 errors"))
		Expect(r.stderr).NotTo(ContainSubstring("panic"))
		Expect(r.stdout).To(ContainSubstring("name: fine"))
	})

	It("defaults for the cluster of --kubevirt: its machine type, CPU model and default interface", func() {
		kv := writeTemp("kubevirt.yaml", `apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    cpuModel: Haswell-noTSX
    architectureConfiguration:
      amd64: {machineType: pc-q35-7.2}
    network: {defaultNetworkInterface: masquerade}
`)
		vm := writeTemp("bare.yaml", vmDoc("bare", "memory: {guest: 128Mi}"))
		builtin := run("", "default", "--libvirt-root", root, "-o", "json", "-f", vm)
		Expect(builtin.exitCode).To(Equal(0), builtin.stderr)
		Expect(builtin.stdout).To(And(ContainSubstring(`"type": "q35"`), ContainSubstring(`"model": "host-model"`), ContainSubstring(`"bridge": {}`)))
		r := run("", "default", "--libvirt-root", root, "-o", "json", "--kubevirt", kv, "-f", vm)
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(And(ContainSubstring(`"type": "pc-q35-7.2"`), ContainSubstring(`"model": "Haswell-noTSX"`), ContainSubstring(`"masquerade": {}`)))
		Expect(r.stdout).NotTo(ContainSubstring(`"bridge"`))

		notKubeVirt := run("", "default", "--libvirt-root", root, "--kubevirt", vm, "-f", vm)
		Expect(notKubeVirt.exitCode).To(Equal(2), "a --kubevirt that is not a KubeVirt CR: the run could not happen")
		Expect(notKubeVirt.stderr).To(ContainSubstring("--kubevirt: " + vm + ":1: VirtualMachine demo/bare: want a kubevirt.io/v1 KubeVirt"))
	})

	It("defaults a VM with host devices but them, naming each value left to the node in a warning", func() {
		vmi := writeTemp("hostdevices.yaml", vmiDoc("passthrough", `
  domain:
    memory: {guest: 128Mi}
    devices:
      interfaces:
      - {name: default, masquerade: {}}
      - {name: vf, sriov: {}}
      gpus: [{name: gpu1, deviceName: nvidia.com/GP102GL_Tesla_P40}]
  networks:
  - {name: default, pod: {}}
  - {name: vf, multus: {networkName: sriov/sriov-network}}`))
		r := run("", "default", "--libvirt-root", root, "-o", "json", "-f", vmi)
		Expect(r.exitCode).To(Equal(0), r.stderr)
		prefix := "Warning: " + vmi + ":1: VirtualMachineInstance demo/passthrough: "
		Expect(strings.Split(strings.TrimSpace(r.stderr), "\n")).To(ConsistOf(
			HavePrefix(prefix+"spec.domain.devices.gpus[0]: a GPU is the node's"),
			HavePrefix(prefix+"spec.domain.devices.interfaces[1].macAddress: "),
			HavePrefix(prefix+"spec.domain.devices.interfaces[1].pciAddress: "),
		))
		var out struct {
			Spec struct {
				Domain struct {
					Devices struct {
						Interfaces []map[string]any
						GPUs       []map[string]any
					}
				}
			}
		}
		Expect(json.Unmarshal([]byte(r.stdout), &out)).To(Succeed())
		ifaces := out.Spec.Domain.Devices.Interfaces
		Expect(ifaces[0]).To(And(HaveKey("pciAddress"), HaveKey("macAddress"), HaveKeyWithValue("model", "virtio")), "the pod NIC is defaulted")
		Expect(ifaces[1]).To(Equal(map[string]any{"name": "vf", "sriov": map[string]any{}}), "the VF is the node's")
		Expect(out.Spec.Domain.Devices.GPUs).To(Equal([]map[string]any{{"name": "gpu1", "deviceName": "nvidia.com/GP102GL_Tesla_P40"}}))
	})

	It("undefines the domains a crashed run left behind", func() {
		leftover := filepath.Join(root, "etc", "qemu", "virt-rules-crashed-1.xml")
		Expect(os.MkdirAll(filepath.Dir(leftover), 0o700)).To(Succeed())
		Expect(os.WriteFile(leftover, []byte(`<domain type="qemu"><name>virt-rules-crashed-1</name><uuid>6c6f7374-0000-4000-8000-000000000001</uuid>
<memory unit="KiB">65536</memory><os><type>hvm</type></os></domain>`), 0o600)).To(Succeed())
		r := run("", "default", "--libvirt-root", root, "-f", "examples/defaults/vm.yaml")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(leftover).NotTo(BeAnExistingFile())
	})
})

// vmDoc is, as a file holds it, the VirtualMachine demo/name whose template's domain has the
// one field domain.
func vmDoc(name, domain string) string {
	return kubevirtDoc("VirtualMachine", name, `
  template:
    spec:
      domain:
        `+domain)
}

// vmiDoc is, as a file holds it, the VirtualMachineInstance demo/name with spec (its lines,
// after a newline).
func vmiDoc(name, spec string) string {
	return kubevirtDoc("VirtualMachineInstance", name, spec)
}

func kubevirtDoc(kind, name, spec string) string {
	return "apiVersion: kubevirt.io/v1\nkind: " + kind + "\nmetadata: {name: " + name + ", namespace: demo}\nspec:" + spec + "\n"
}
