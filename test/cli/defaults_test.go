//go:build libvirt

package cli_test

import (
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
		Expect(strings.Fields(patch.stdout)).To(Equal([]string{"[]", "[]", "[]"}))
	})

	It("prints the JSON patch with --patch, reading stdin", func() {
		vm, err := os.ReadFile(filepath.Join(repoRoot, "examples", "defaults", "vm.yaml"))
		Expect(err).NotTo(HaveOccurred())
		r := run(string(vm), "default", "--libvirt-root", root, "--patch", "-o", "json", "-f", "-")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(ContainSubstring(`"path": "/spec/template/spec/domain/machine"`))
	})

	It("names the file, the object and the field of bad input, and exits non-zero", func() {
		bad := writeTemp("bad.yaml", `apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: nomem, namespace: demo}
spec:
  template:
    spec:
      domain:
        devices: {}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
`)
		r := run("", "default", "--libvirt-root", root, "-f", bad)
		Expect(r.exitCode).To(Equal(1))
		Expect(r.stderr).To(ContainSubstring(bad + ":1: VirtualMachine demo/nomem: spec.template.spec.domain.memory.guest: "))
		Expect(r.stderr).To(ContainSubstring(bad + ":2: ConfigMap cm: only VirtualMachines and VirtualMachineInstances are defaulted"))
		Expect(r.stderr).NotTo(ContainSubstring("panic"))
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
