package integration_test

import (
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

var _ = Describe("The CRDs of examples/deploy/crds: the kinds KubeVirt does not ship", func() {
	It("are listed by the kustomization, well-formed, and Established", func() {
		var kustomization struct {
			APIVersion string   `json:"apiVersion"`
			Kind       string   `json:"kind"`
			Resources  []string `json:"resources"`
		}
		readStrict(filepath.Join(crdDir, "kustomization.yaml"), &kustomization)
		files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		var crdFiles []string
		for _, f := range files {
			if filepath.Base(f) != "kustomization.yaml" {
				crdFiles = append(crdFiles, filepath.Base(f))
			}
		}
		Expect(kustomization.Resources).To(ConsistOf(crdFiles), "kustomization.yaml lists every CRD file")
		Expect(crdFiles).To(ConsistOf("pool.virt-rules.io_virtualmachinepools.yaml", "cdi.kubevirt.io_datavolumes.yaml"))

		for _, f := range crdFiles {
			var want apiextensionsv1.CustomResourceDefinition
			readStrict(filepath.Join(crdDir, f), &want) // envtest itself ignores unknown fields
			Expect(want.Name).To(Equal(want.Spec.Names.Plural+"."+want.Spec.Group), f)

			got := &apiextensionsv1.CustomResourceDefinition{}
			Expect(k8sClient.Get(ctx, client.ObjectKey{Name: want.Name}, got)).To(Succeed(), f)
			Expect(got.Status.Conditions).To(ContainElement(And(
				HaveField("Type", apiextensionsv1.Established),
				HaveField("Status", apiextensionsv1.ConditionTrue),
			)), "%s is Established", want.Name)
			Expect(got.Status.AcceptedNames.ShortNames).To(Equal(want.Spec.Names.ShortNames), f)
		}
	})
})

// What virt-rules relies on, and where it cannot rely, in KubeVirt's own schemas (the CRDs
// KubeVirt's operator generates, from the version the test cluster runs).
var _ = Describe("KubeVirt's CRDs", func() {
	It("store a VirtualMachineInstance with its status, as upstream (no status subresource)", func() {
		ns := createNamespace()
		vmi := &kubevirtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Name: "fedora", Namespace: ns, Labels: map[string]string{"gpu": "nvidia"}},
			Spec: kubevirtv1.VirtualMachineInstanceSpec{
				NodeSelector: map[string]string{"zone": "a"},
				Domain:       kubevirtv1.DomainSpec{CPU: &kubevirtv1.CPU{Model: "host-model"}},
			},
			Status: kubevirtv1.VirtualMachineInstanceStatus{NodeName: "node-1", Phase: kubevirtv1.Running},
		}
		create(vmi)

		got := &kubevirtv1.VirtualMachineInstance{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(vmi), got)).To(Succeed())
		Expect(got.Labels).To(HaveKeyWithValue("gpu", "nvidia"))
		Expect(got.Spec.NodeSelector).To(Equal(map[string]string{"zone": "a"}))
		Expect(got.Spec.Domain.CPU.Model).To(Equal("host-model"))
		Expect(got.Status.NodeName).To(Equal("node-1"))
		Expect(got.Status.Phase).To(Equal(kubevirtv1.Running))
	})

	It("admit a VirtualMachineInstanceMigration without spec.vmiName: only virt-api's webhook refuses it", func() {
		ns := createNamespace()
		vmim := fromYAML(`
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata: {name: no-vmi, namespace: ` + ns + `}
spec:
  addedNodeSelector: {zone: a}
`)
		Expect(tryCreate(vmim)).To(Succeed())
	})

	It("keep a VirtualMachineInstanceMigration's spec but drop design 001's addedNodeSelectorTerm, and its status only through the status subresource", func() {
		ns := createNamespace()
		vmim := fromYAML(`
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata:
  name: to-node-2
  namespace: ` + ns + `
  annotations:
    migrations.virt-rules.io/added-node-selector-term: '{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-2"]}]}'
spec:
  vmiName: db
  addedNodeSelector: {zone: a}
  addedNodeSelectorTerm:
    matchFields:
    - {key: metadata.name, operator: In, values: [node-2]}
status:
  phase: Succeeded
`)
		sent := vmim.DeepCopy()
		create(vmim)

		got := get(vmim)
		Expect(got.Object["spec"]).To(Equal(map[string]any{"vmiName": "db", "addedNodeSelector": map[string]any{"zone": "a"}}),
			"KubeVirt has no addedNodeSelectorTerm: the annotation is the term's carrier")
		Expect(got.GetAnnotations()).To(Equal(sent.GetAnnotations()))
		Expect(got.Object).NotTo(HaveKey("status"), "create ignores status")

		Expect(unstructured.SetNestedField(got.Object, "Running", "status", "phase")).To(Succeed())
		Expect(k8sClient.Status().Update(ctx, got)).To(Succeed())
		Expect(get(vmim).Object["status"]).To(Equal(map[string]any{"phase": "Running"}))
	})

	DescribeTable("take a MigrationPolicy's selectors as plain label maps only",
		func(selectors string, admitted bool) {
			policy := fromYAML(`
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {generateName: policy-}
spec:
  bandwidthPerMigration: 1Gi
  completionTimeoutPerGiB: 300
  allowPostCopy: true
  selectors:
` + selectors)
			sent := policy.DeepCopy()
			err := tryCreate(policy)
			if !admitted {
				Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
				Expect(err.Error()).To(ContainSubstring("matchLabels"))
				return
			}
			Expect(err).NotTo(HaveOccurred())
			Expect(get(policy).Object["spec"]).To(Equal(sent.Object["spec"]))
		},
		Entry("KubeVirt's label maps", `
    namespaceSelector: {priority: high}
    virtualMachineInstanceSelector: {size: small, gpu: nvidia}
`, true),
		Entry("a VMI selector only", `
    virtualMachineInstanceSelector: {gpu: nvidia}
`, true),
		Entry("not design 000's matchLabels", `
    namespaceSelector:
      matchLabels: {priority: high}
    virtualMachineInstanceSelector:
      matchLabels: {size: small, gpu: nvidia}
`, false),
		Entry("not one of each", `
    namespaceSelector: {priority: high}
    virtualMachineInstanceSelector:
      matchLabels: {gpu: nvidia}
`, false),
	)

	It("drop whatever is written to a MigrationPolicy's status: virt-rules keeps it in annotations", func() {
		policy := fromYAML(`
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {generateName: status-}
spec: {selectors: {virtualMachineInstanceSelector: {app: status}}}
`)
		create(policy)
		got := get(policy)
		got.Object["status"] = map[string]any{"virtualMachineInstances": int64(3)}
		Expect(k8sClient.Status().Update(ctx, got)).To(Succeed())
		Expect(get(policy).Object["status"]).To(BeEmpty())
	})

	It("reject a MigrationPolicy with a mistyped setting", func() {
		for _, spec := range []string{"{selectors: {}, allowPostCopy: maybe}", "{selectors: {}, completionTimeoutPerGiB: long}"} {
			policy := fromYAML(`
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {generateName: bad-policy-}
spec: ` + spec)
			err := tryCreate(policy)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "spec %s: want Invalid, got %v", spec, err)
		}
	})

	It("drop design 002's knobs from the KubeVirt CR: virt-rules reads them from annotations", func() {
		kv := fromYAML(`
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt}
spec:
  configuration:
    cpuModel: host-model
    migrations:
      bandwidthPerMigration: 64Mi
      parallelMigrationsPerCluster: 10
      requireHostModelMigratabilityLevel: 50
      preferedHostModelMigratabilityLevel: {level: 70, weight: 20}
    developerConfiguration:
      featureGates: [LiveMigration]
  workloads: {nodePlacement: {nodeSelector: {role: virt}}}
`)
		kv.SetNamespace(createNamespace())
		create(kv)
		migrations, _, err := unstructured.NestedMap(get(kv).Object, "spec", "configuration", "migrations")
		Expect(err).NotTo(HaveOccurred())
		Expect(migrations).To(Equal(map[string]any{"bandwidthPerMigration": "64Mi", "parallelMigrationsPerCluster": int64(10)}))
	})

	DescribeTable("round-trip what virt-rules reads",
		func(doc string) {
			obj := fromYAML(doc)
			if obj.GetNamespace() == "" {
				obj.SetNamespace(createNamespace())
			}
			sent := obj.DeepCopy()
			create(obj)
			Expect(get(obj).Object["spec"]).To(Equal(sent.Object["spec"]))
		},
		Entry("VirtualMachine: a whole template", `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: db}
spec:
  runStrategy: Always
  template:
    metadata: {labels: {app: db}}
    spec:
      domain:
        cpu: {model: host-model, cores: 2}
        devices:
          disks: [{name: root, disk: {bus: virtio}}]
        memory: {guest: 2Gi}
      volumes: [{name: root, dataVolume: {name: db-root}}]
`),
		Entry("DataVolume: an import", `
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: db-root}
spec:
  source:
    http: {url: "https://example.com/fedora.qcow2"}
  storage:
    resources: {requests: {storage: 10Gi}}
    storageClassName: local
`),
		Entry("VirtualMachineInstance: unknown fields in domain and beside it", `
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vmi}
spec:
  domain:
    devices: {interfaces: [{name: default, masquerade: {}}]}
    features: {acpi: {}}
  evictionStrategy: LiveMigrate
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: zone, operator: In, values: [a, b]}]
`),
	)
})

// get reads obj's current state from the server.
func get(obj *unstructured.Unstructured) *unstructured.Unstructured {
	GinkgoHelper()
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(obj.GroupVersionKind())
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
	return got
}

// readStrict decodes a YAML file into out, failing on fields out does not have.
func readStrict(path string, out any) {
	GinkgoHelper()
	data, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	Expect(yaml.UnmarshalStrict(data, out)).To(Succeed(), path)
}
