package kubevirt_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// A VM as a user writes it: no machine type, CPU model, NIC model, MAC or PCI address.
var defaultsVMYAML = clustersuite.VMYAML(clustersuite.VMI{
	Spec:     []string{"networks: [{name: default, pod: {}}]"},
	Devices:  []string{"interfaces: [{name: default, masquerade: {}}]"},
	Requests: "{memory: 1Gi}",
})

var _ = Describe("VM defaults beside KubeVirt (design 004)", Ordered, func() {
	var ns string

	BeforeAll(func() {
		if !defaults.WithLibvirt {
			Skip("this test binary was built without libvirt (-tags libvirt): no defaulter")
		}
		ns = namespace(map[string]string{defaultsNamespaceLabel: "true"})
	})

	It("passes KubeVirt's mutating webhook, the defaults webhook and KubeVirt's validating webhook, and its launcher pod schedules", func() {
		apply(ns, defaultsVMYAML, "fedora")
		vm := get(vmKind, ns, "fedora")(Default)
		domain := func(path ...string) any {
			return field(vm, append([]string{"spec", "template", "spec", "domain"}, path...)...)
		}
		// KubeVirt's mutator ran first (machine type from the cluster's configuration), then
		// the defaults webhook filled in what the guest sees; KubeVirt's validation admitted it.
		Expect(domain("machine", "type")).To(Equal("q35"))
		Expect(domain("firmware", "uuid")).NotTo(BeNil())
		nic := domain("devices", "interfaces").([]any)[0].(map[string]any)
		Expect(nic).To(And(HaveKey("macAddress"), HaveKey("pciAddress"), HaveKey("model")))

		Eventually(func(g Gomega) any { return field(get(vmiKind, ns, "fedora")(g), "status", "phase") }).Should(Equal("Running"),
			func() string {
				return fmt.Sprintf("VM status: %v", field(get(vmKind, ns, "fedora")(Default), "status"))
			})
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-launcher"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(1))
		Expect(pods.Items[0].Spec.NodeName).NotTo(BeEmpty(), "scheduled")
	})

	It("defaults a VM of an instancetype and a preference, as KubeVirt applies them, and its running VMI has the guest the VM states", func() {
		apply(ns, `apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata: {name: small}
spec: {cpu: {guest: 2}, memory: {guest: 1Gi}}`)
		apply(ns, `apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachinePreference
metadata: {name: fedora}
spec:
  cpu: {preferredCPUTopology: cores}
  devices: {preferredDiskBus: virtio, preferredInterfaceModel: e1000, preferredRng: {}}`)
		user, warnings := warnedClient()
		vm := fromYAML(`apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: typed}
spec:
  instancetype: {kind: VirtualMachineInstancetype, name: small}
  preference: {kind: VirtualMachinePreference, name: fedora}
  runStrategy: Always
  template:
    spec:
      domain:
        devices:
          disks: [{name: containerdisk}]
      volumes:
      - name: containerdisk
        containerDisk: {image: ` + clustersuite.ContainerDiskImage + `}`)
		vm.SetNamespace(ns)
		Expect(user.Create(ctx, vm)).To(Succeed())
		Expect(warnings.texts()).To(ContainElements(
			HavePrefix("virt-rules: spec.instancetype: left to VirtualMachineInstancetype small"),
			HavePrefix("virt-rules: spec.preference: left to VirtualMachinePreference fedora"),
		), "what is left to the instancetype and the preference, named to the user")
		stored := get(vmKind, ns, "typed")(Default)
		template := field(stored, "spec", "template", "spec").(map[string]any)
		// What the instancetype and the preference give stays theirs: KubeVirt refuses a VM that
		// sets what its instancetype sets.
		Expect(field(stored, "spec", "template", "spec", "domain", "cpu", "cores")).To(BeNil())
		Expect(field(stored, "spec", "template", "spec", "domain", "memory")).To(BeNil())
		disk := field(stored, "spec", "template", "spec", "domain", "devices", "disks").([]any)[0].(map[string]any)
		Expect(disk).To(HaveKeyWithValue("disk", HaveKey("pciAddress")), "libvirt's address of the preference's virtio disk")
		Expect(disk).NotTo(HaveKeyWithValue("disk", HaveKey("bus")))

		Eventually(func(g Gomega) any { return field(get(vmiKind, ns, "typed")(g), "status", "phase") }).Should(Equal("Running"),
			func() string { return fmt.Sprintf("VM status: %v", field(get(vmKind, ns, "typed")(Default), "status")) })
		vmi := get(vmiKind, ns, "typed")(Default)
		// KubeVirt applied them: the instancetype's vCPUs as the preference lays them out, its
		// memory, the preference's bus and NIC model.
		Expect(field(vmi, "spec", "domain", "cpu", "cores")).To(BeNumerically("==", 2))
		Expect(field(vmi, "spec", "domain", "memory", "guest")).To(Equal("1Gi"))
		Expect(field(vmi, "spec", "domain", "devices", "disks").([]any)[0]).To(HaveKeyWithValue("disk", HaveKeyWithValue("bus", "virtio")))
		Expect(field(vmi, "spec", "domain", "devices", "interfaces").([]any)[0]).To(HaveKeyWithValue("model", "e1000"))
		// Every value the defaulted VM states, the VMI has.
		var differ []string
		var walk func(path string, ours, theirs any)
		walk = func(path string, ours, theirs any) {
			switch x := ours.(type) {
			case map[string]any:
				t, _ := theirs.(map[string]any)
				for k, c := range x {
					walk(path+"."+k, c, t[k])
				}
			case []any:
				t, _ := theirs.([]any)
				for i, c := range x {
					var ti any
					if i < len(t) {
						ti = t[i]
					}
					walk(fmt.Sprintf("%s[%d]", path, i), c, ti)
				}
			default:
				if fmt.Sprint(ours) != fmt.Sprint(theirs) {
					differ = append(differ, fmt.Sprintf("%s: VM %v, VMI %v", path, ours, theirs))
				}
			}
		}
		vmiSpec := field(vmi, "spec").(map[string]any)
		for _, key := range []string{"domain", "networks"} {
			walk(key, template[key], vmiSpec[key])
		}
		Expect(differ).To(BeEmpty())
	})

	It("defaults for the cluster's KubeVirt CR and the namespace's UID, keeps KubeVirt's firmware identity, and warns of what it leaves to the node", func() {
		user, warnings := warnedClient()
		doc := fmt.Sprintf(defaultsVMYAML, "vf")
		doc = strings.Replace(doc, "runStrategy: Always", "runStrategy: Halted", 1)
		doc = strings.Replace(doc, "interfaces: [{name: default, masquerade: {}}]", "interfaces: [{name: default, masquerade: {}}, {name: vf, sriov: {}}]", 1)
		doc = strings.Replace(doc, "networks: [{name: default, pod: {}}]", "networks: [{name: default, pod: {}}, {name: vf, multus: {networkName: sriov}}]", 1)
		original := fromYAML(doc)
		original.SetNamespace(ns)
		created := original.DeepCopy()
		Expect(user.Create(ctx, created)).To(Succeed())
		Expect(warnings.texts()).To(ContainElements(
			HavePrefix("virt-rules: spec.template.spec.domain.devices.interfaces[1].macAddress: "),
			HavePrefix("virt-rules: spec.template.spec.domain.devices.interfaces[1].pciAddress: "),
		), "each value left to the node, named to the user")

		vm := get(vmKind, ns, "vf")(Default)
		domain := func(path ...string) any {
			return field(vm, append([]string{"spec", "template", "spec", "domain"}, path...)...)
		}
		// The cluster's configuration: its KubeVirt CR's CPU model, else KubeVirt's host-model.
		kubevirts := &unstructured.UnstructuredList{}
		kubevirts.SetGroupVersionKind(testcluster.GVKKubeVirt.GroupVersion().WithKind("KubeVirtList"))
		Expect(k8s.List(ctx, kubevirts)).To(Succeed())
		Expect(kubevirts.Items).To(HaveLen(1))
		cpuModel, _, _ := unstructured.NestedString(kubevirts.Items[0].Object, "spec", "configuration", "cpuModel")
		if cpuModel == "" {
			cpuModel = "host-model"
		}
		Expect(domain("cpu", "model")).To(Equal(cpuModel))

		// KubeVirt's VM mutator gave the VM a random firmware UUID and serial (KubeVirt v1.8's
		// persisted identity) before the defaults webhook ran, which keeps them.
		Expect(domain("firmware", "uuid")).To(MatchRegexp(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-`))
		Expect(domain("firmware", "serial")).NotTo(BeEmpty())

		// KubeVirt sets no MAC ahead (virt-launcher takes the pod's): the defaulter derives it
		// from the namespace's UID, what it gives the same VMI asked with that UID, not from its
		// name (what it gives it offline). The VMI's firmware UUID is KubeVirt's (API defaults
		// draw one), kept.
		vmiDoc := `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: standalone}
spec:
  domain:
    devices:
      interfaces: [{name: default, masquerade: {}}]
    resources: {requests: {memory: 128Mi}}
  networks: [{name: default, pod: {}}]
`
		vmiOriginal := fromYAML(vmiDoc)
		vmiOriginal.SetNamespace(ns)
		Expect(k8s.Create(ctx, vmiOriginal.DeepCopy())).To(Succeed())
		storedVMI := get(vmiKind, ns, "standalone")(Default)
		Expect(field(storedVMI, "spec", "domain", "firmware", "uuid")).To(MatchRegexp(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-`))
		namespace := &corev1.Namespace{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: ns}, namespace)).To(Succeed())
		raw, err := vmiOriginal.MarshalJSON()
		Expect(err).NotTo(HaveOccurred())
		macFor := func(namespaceUID string) any {
			body, err := json.Marshal(defaults.Request{APIVersion: defaults.RequestAPIVersion, Kind: defaults.RequestKind, Object: raw, NamespaceUID: namespaceUID})
			Expect(err).NotTo(HaveOccurred())
			resp, err := http.Post(defaulterURL+defaults.Path, "application/json", bytes.NewReader(body))
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
			var answer map[string]any
			Expect(json.NewDecoder(resp.Body).Decode(&answer)).To(Succeed())
			return firstMAC(&unstructured.Unstructured{Object: answer}, "spec", "domain")
		}
		Expect(firstMAC(storedVMI, "spec", "domain")).To(Equal(macFor(string(namespace.UID))))
		Expect(firstMAC(storedVMI, "spec", "domain")).NotTo(Equal(macFor("")))
	})

	It("never makes KubeVirt refuse one of its own examples, or virt-rules' examples/defaults, it admits as written", func() {
		// Each example is created with a server-side dry run twice: in a namespace without the
		// defaults webhook (KubeVirt's verdict on it as written) and in one with it (KubeVirt's
		// mutators, the defaults webhook, then KubeVirt's validation).
		plain, defaulting := namespace(nil), namespace(map[string]string{defaultsNamespaceLabel: "true"})
		// The instancetypes and preferences the examples refer to, in both namespaces (the
		// cluster-wide ones once): KubeVirt and the defaults webhook read them.
		examples, references := kubevirtExamples()
		for _, o := range references {
			for _, ns := range []string{plain, defaulting} {
				ref := o.Unstructured.DeepCopy()
				if strings.HasPrefix(ref.GetKind(), "VirtualMachineCluster") {
					if ns == defaulting {
						continue
					}
				} else {
					ref.SetNamespace(ns)
				}
				Expect(k8s.Create(ctx, ref)).To(Succeed(), o.Describe())
				DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, ref))).To(Succeed()) })
			}
		}
		var broken []string
		admitted, defaulted := 0, 0
		for _, o := range examples {
			asWritten := o.Unstructured.DeepCopy()
			asWritten.SetNamespace(plain)
			if err := k8s.Create(ctx, asWritten, client.DryRunAll); err != nil {
				AddReportEntry("refused by KubeVirt as written", fmt.Sprintf("%s (%s): %v", o.Describe(), filepath.Base(o.Source), err))
				continue
			}
			admitted++
			withDefaults := o.Unstructured.DeepCopy()
			withDefaults.SetNamespace(defaulting)
			if err := k8s.Create(ctx, withDefaults, client.DryRunAll); err != nil {
				broken = append(broken, fmt.Sprintf("%s (%s): %v", o.Describe(), filepath.Base(o.Source), err))
				continue
			}
			// KubeVirt writes no PCI address; the defaults webhook does.
			before, _ := json.Marshal(asWritten.Object["spec"])
			after, _ := json.Marshal(withDefaults.Object["spec"])
			if !bytes.Contains(before, []byte(`"pciAddress"`)) && bytes.Contains(after, []byte(`"pciAddress"`)) {
				defaulted++
			}
		}
		AddReportEntry("examples", fmt.Sprintf("%d admitted as written, %d of them defaulted and admitted", admitted, defaulted))
		Expect(broken).To(BeEmpty(), "examples KubeVirt admits as written but refuses defaulted")
		Expect(admitted).To(BeNumerically(">", 25))
		Expect(defaulted).To(Equal(admitted), "every example KubeVirt admits was defaulted, those with an instancetype and a preference too")
	})
})

// kubevirtExamples are the VirtualMachines and VirtualMachineInstances in KubeVirt's own
// examples/, read from the kubevirt.io/kubevirt module the cluster runs, and in virt-rules'
// examples/defaults/, and the instancetypes and preferences they refer to.
func kubevirtExamples() (vms, references []manifest.Object) {
	GinkgoHelper()
	files, _, err := testcluster.VMExampleFiles(ctx, repoRoot, cluster.KubeVirtVersion)
	Expect(err).NotTo(HaveOccurred())
	objs, err := manifest.Read(files, nil)
	Expect(err).NotTo(HaveOccurred())
	for _, o := range objs {
		switch {
		case o.GetAPIVersion() == defaults.InstancetypeGroup+"/v1beta1":
			references = append(references, o)
		case o.GetAPIVersion() == "kubevirt.io/v1" && (o.GetKind() == "VirtualMachine" || o.GetKind() == "VirtualMachineInstance"):
			vms = append(vms, o)
		}
	}
	return vms, references
}

// firstMAC is the MAC of the first interface of the domain at path in obj.
func firstMAC(obj *unstructured.Unstructured, path ...string) any {
	ifaces, _ := field(obj, append(path, "devices", "interfaces")...).([]any)
	if len(ifaces) == 0 {
		return nil
	}
	iface, _ := ifaces[0].(map[string]any)
	return iface["macAddress"]
}
