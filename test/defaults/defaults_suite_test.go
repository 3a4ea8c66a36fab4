//go:build libvirt

// Package defaults_test runs the vm.defaults decision against a real libvirt: the embedded
// QEMU driver of libvirt.org/go/libvirt, started by the suite in a throwaway directory on
// tmpfs, and the defaulter HTTP service in front of it. Nothing is faked.
package defaults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

var (
	lv        *defaults.Libvirt
	defaulter *defaults.Defaulter
	service   *defaults.Service
	server    *httptest.Server
	ctx       = context.Background()
)

func TestDefaults(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "vm.defaults against real libvirt")
}

var _ = BeforeSuite(func() {
	lv, defaulter = clustersuite.Defaulter(ctx, "virt-rules-defaults-test-")
	service = defaults.NewService(defaulter.Engine, nil)
	service.SetHypervisor(lv)
	server = httptest.NewServer(service)
	DeferCleanup(server.Close)
})

// vmYAML is a VirtualMachine as its YAML, as JSON.
func vmJSON(doc string) []byte {
	GinkgoHelper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	Expect(err).NotTo(HaveOccurred())
	return j
}

// vmDoc is the VirtualMachine demo/name whose VMI template has spec: YAML lines at the
// column of the template spec's fields (six spaces), after a newline.
func vmDoc(name, spec string) string {
	return fmt.Sprintf(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: %s, namespace: demo}
spec:
  template:
    spec:%s
`, name, spec)
}

// vmiOf is the VirtualMachineInstance that the VirtualMachine doc starts, as JSON: the VM's
// name and namespace, its template's spec.
func vmiOf(doc string) []byte {
	GinkgoHelper()
	var vm struct {
		Metadata map[string]any `json:"metadata"`
		Spec     struct {
			Template struct {
				Spec map[string]any `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	Expect(json.Unmarshal(vmJSON(doc), &vm)).To(Succeed())
	vmi, err := json.Marshal(map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": vm.Metadata, "spec": vm.Spec.Template.Spec,
	})
	Expect(err).NotTo(HaveOccurred())
	return vmi
}

// defaultVM defaults doc and decodes the result into KubeVirt's type.
func defaultVM(doc string) (*kubevirtv1.VirtualMachine, *defaults.Result) {
	GinkgoHelper()
	res, err := defaulter.Default(ctx, vmJSON(doc))
	Expect(err).NotTo(HaveOccurred())
	vm := &kubevirtv1.VirtualMachine{}
	Expect(json.Unmarshal(res.Object, vm)).To(Succeed())
	return vm, res
}

// The seed's minimal VM, today's API.
const minimalVM = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: testvm, namespace: demo}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices:
          interfaces:
          - {name: default, masquerade: {}}
        memory: {guest: 64Mi}
      networks:
      - {name: default, pod: {}}
`
