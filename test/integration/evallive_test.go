package integration_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/internal/live"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// evalReport is the part of `eval -o json` these specs read.
type evalReport struct {
	MigrationPolicies []struct {
		VMI    string  `json:"vmi"`
		Policy *string `json:"policy"`
	} `json:"migrationPolicies"`
	NodeMigratability []struct {
		Node  string `json:"node"`
		Level int    `json:"level"`
	} `json:"nodeMigratability"`
	Drift []struct {
		Kind    string `json:"kind"`
		Object  string `json:"object"`
		Field   string `json:"field"`
		Stored  any    `json:"stored"`
		Decided any    `json:"decided"`
	} `json:"drift"`
}

var _ = Describe("virt-rules eval --kubeconfig on the live cluster", Ordered, func() {
	var (
		binary, kubeconfig, prefix string
	)

	// runEval runs the binary's eval with args and returns stdout, stderr and the exit status.
	runEval := func(args ...string) (string, string, int) {
		GinkgoHelper()
		stdout, stderr, code, err := clustersuite.RunBinary(ctx, binary, append([]string{"eval"}, args...)...)
		Expect(err).NotTo(HaveOccurred())
		return stdout, stderr, code
	}

	// dump writes every object of the kinds eval reads, as the API server returns them, to one
	// manifest file: what `kubectl get -o yaml` of the same objects would give.
	dump := func() string {
		GinkgoHelper()
		var docs []string
		for _, res := range live.Resources {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(res.GroupVersion().WithKind(res.Kind + "List"))
			opts := &client.ListOptions{Raw: &metav1.ListOptions{LabelSelector: res.LabelSelector, FieldSelector: res.FieldSelector}}
			if err := k8sClient.List(ctx, list, opts); meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
				continue // not served here (KubeVirt's pools): eval skips it too, with a warning
			} else {
				Expect(err).NotTo(HaveOccurred(), res.Resource)
			}
			for _, item := range list.Items {
				item.SetGroupVersionKind(res.GroupVersion().WithKind(res.Kind))
				data, err := yaml.Marshal(item.Object)
				Expect(err).NotTo(HaveOccurred())
				docs = append(docs, string(data))
			}
		}
		path := filepath.Join(GinkgoT().TempDir(), "cluster.yaml")
		Expect(os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o644)).To(Succeed())
		return path
	}

	BeforeAll(func(sctx SpecContext) {
		binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")
		kubeconfig = writeKubeconfig()

		// Design 000's example and examples/migratability's nodes, renamed with a prefix of
		// this run: other specs share the cluster and its cluster-scoped kinds.
		prefix = "live-" + rand.String(5) + "-"
		// Policies are cluster-scoped and judged together (duplicates are invalid): start from none.
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(schema.GroupVersionKind{Group: "migrations.kubevirt.io", Version: "v1alpha1", Kind: "MigrationPolicy"}))).To(Succeed())
		// Other specs leave migrations of VMIs that never existed here (no KubeVirt on this
		// cluster): live, eval warns and skips them, but the same objects as manifests are
		// refused, so the comparison with a dump starts from none.
		migrations := &unstructured.UnstructuredList{}
		migrations.SetGroupVersionKind(schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachineInstanceMigrationList"})
		Expect(k8sClient.List(ctx, migrations)).To(Succeed())
		for i := range migrations.Items {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, &migrations.Items[i]))).To(Succeed())
		}
		objs, err := manifest.Read([]string{
			filepath.Join(repoRoot, "examples", "migration-policy", "namespaces.yaml"),
			filepath.Join(repoRoot, "examples", "migration-policy", "policies.yaml"),
			filepath.Join(repoRoot, "examples", "migration-policy", "vmis.yaml"),
			filepath.Join(repoRoot, "examples", "migratability", "nodes.yaml"),
		}, nil)
		Expect(err).NotTo(HaveOccurred())
		namespaces := map[string]bool{}
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				namespaces[o.GetName()] = true
			}
		}
		for _, o := range objs {
			if ns := o.GetNamespace(); ns != "" && !namespaces[ns] {
				namespaces[ns] = true
				create(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": prefix + ns}}})
			}
		}
		for _, o := range objs {
			u := o.Unstructured.DeepCopy()
			if u.GetNamespace() != "" {
				u.SetNamespace(prefix + u.GetNamespace())
			}
			u.SetName(prefix + u.GetName())
			create(u)
		}
	}, NodeTimeout(5*time.Minute))

	It("reports what the same objects as manifests give, paging through every list", func() {
		liveOut, stderr, code := runEval("--kubeconfig", kubeconfig, "--page-size", "2")
		Expect(code).To(Equal(0), stderr)
		fileOut, stderr, code := runEval("--drift", dump())
		Expect(code).To(Equal(0), stderr)
		Expect(liveOut).To(MatchJSON(fileOut))

		var r evalReport
		Expect(json.Unmarshal([]byte(liveOut), &r)).To(Succeed())
		policies := map[string]string{}
		for _, p := range r.MigrationPolicies {
			if p.Policy != nil {
				policies[p.VMI] = *p.Policy
			}
		}
		Expect(policies).To(HaveKeyWithValue(prefix+"hpc/"+prefix+"fedora-gpu", prefix+"tuned-bandwidth"))
		// Levels count every node of the cluster, other specs' too: only their presence is
		// this spec's to say; the file report above says they are the same.
		levels := map[string]int{}
		for _, n := range r.NodeMigratability {
			levels[n.Node] = n.Level
		}
		for _, name := range []string{"skylake-1", "skylake-2", "cascadelake-1", "cascadelake-2", "icelake-1"} {
			Expect(levels).To(HaveKey(prefix + name))
		}
	})

	It("shows drift where a node's level label or a VMI's policy annotation differs from the decision", func() {
		driftOf := func(object string) map[string][2]any {
			GinkgoHelper()
			out, stderr, code := runEval("--kubeconfig", kubeconfig)
			Expect(code).To(Equal(0), stderr)
			var r evalReport
			Expect(json.Unmarshal([]byte(out), &r)).To(Succeed())
			fields := map[string][2]any{}
			for _, d := range r.Drift {
				if d.Object == object {
					fields[d.Field] = [2]any{d.Stored, d.Decided}
				}
			}
			return fields
		}
		const levelField = "metadata.labels.kubevirt/host-model-migratability-level"
		before := driftOf(prefix + "skylake-1")
		Expect(before).To(HaveKey(levelField), "no label yet")
		Expect(before[levelField][0]).To(BeNil())
		level, ok := before[levelField][1].(string)
		Expect(ok).To(BeTrue(), "the decided level, as the label's text: %v", before[levelField][1])

		patch := func(u *unstructured.Unstructured, meta map[string]any) {
			data, err := json.Marshal(map[string]any{"metadata": meta})
			Expect(err).NotTo(HaveOccurred())
			Expect(k8sClient.Patch(ctx, u, client.RawPatch("application/merge-patch+json", data))).To(Succeed())
		}
		node := &unstructured.Unstructured{}
		node.SetAPIVersion("v1")
		node.SetKind("Node")
		node.SetName(prefix + "skylake-1")
		patch(node, map[string]any{"labels": map[string]any{"kubevirt/host-model-migratability-level": level}})
		Expect(driftOf(prefix + "skylake-1")).NotTo(HaveKey(levelField))
		patch(node, map[string]any{"labels": map[string]any{"kubevirt/host-model-migratability-level": "7"}})
		Expect(driftOf(prefix + "skylake-1")).To(HaveKeyWithValue(levelField, [2]any{"7", level}))

		vmi := &unstructured.Unstructured{}
		vmi.SetAPIVersion("kubevirt.io/v1")
		vmi.SetKind("VirtualMachineInstance")
		vmi.SetNamespace(prefix + "hpc")
		vmi.SetName(prefix + "fedora-gpu")
		const policyField = "metadata.annotations.migrations.virt-rules.io/policy"
		key := prefix + "hpc/" + prefix + "fedora-gpu"
		Expect(driftOf(key)).To(HaveKeyWithValue(policyField, [2]any{nil, prefix + "tuned-bandwidth"}))
		patch(vmi, map[string]any{"annotations": map[string]any{"migrations.virt-rules.io/policy": prefix + "tuned-bandwidth"}})
		Expect(driftOf(key)).NotTo(HaveKey(policyField))
		patch(vmi, map[string]any{"annotations": map[string]any{"migrations.virt-rules.io/policy": "stale"}})
		Expect(driftOf(key)).To(HaveKeyWithValue(policyField, [2]any{"stale", prefix + "tuned-bandwidth"}))
	})

	It("reports a finished migration of a VMI gone as history, a pending one as an error located in the cluster, and decides the rest", func() {
		migration := func(name, phase string) *unstructured.Unstructured {
			GinkgoHelper()
			m := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
				"metadata": map[string]any{"name": prefix + name, "namespace": prefix + "hpc"},
				"spec":     map[string]any{"vmiName": prefix + "gone"},
			}}
			create(m)
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, m))).To(Succeed()) })
			if phase != "" {
				Expect(unstructured.SetNestedField(m.Object, phase, "status", "phase")).To(Succeed())
				Expect(k8sClient.Status().Update(ctx, m)).To(Succeed())
			}
			return m
		}
		migration("orphan", "")
		migration("done", "Succeeded")
		out, stderr, code := runEval("--kubeconfig", kubeconfig)
		Expect(code).To(Equal(1), stderr)
		Expect(stderr).To(ContainSubstring("error: cluster: VirtualMachineInstanceMigration %[1]shpc/%[1]sorphan: spec.vmiName: VirtualMachineInstance %[1]shpc/%[1]sgone is not among the inputs, and the migration is not finished (phase none)", prefix))
		var r struct {
			MigrationPolicies []json.RawMessage `json:"migrationPolicies"`
			MigrationTargets  []struct {
				Migration string `json:"migration"`
				Phase     string `json:"phase"`
			} `json:"migrationTargets"`
			Errors []manifest.Error `json:"errors"`
		}
		Expect(json.Unmarshal([]byte(out), &r)).To(Succeed())
		Expect(r.MigrationPolicies).NotTo(BeEmpty())
		phases := map[string]string{}
		for _, t := range r.MigrationTargets {
			phases[t.Migration] = t.Phase
		}
		Expect(phases).To(HaveKeyWithValue(prefix+"hpc/"+prefix+"done", "Succeeded"))
		Expect(phases).NotTo(HaveKey(prefix + "hpc/" + prefix + "orphan"))
		Expect(r.Errors).To(ConsistOf(manifest.Error{
			Kind: "VirtualMachineInstanceMigration", Namespace: prefix + "hpc", Name: prefix + "orphan", Location: "cluster",
			Field: "spec.vmiName", Reason: manifest.ReasonInconsistent,
			Message: "VirtualMachineInstance " + prefix + "hpc/" + prefix + "gone is not among the inputs, and the migration is not finished (phase none)",
		}))
	})

	It("needs only examples/rbac/eval.yaml's read-only ClusterRole, and names what a user lacks", func() {
		objs, err := manifest.Read([]string{filepath.Join(repoRoot, "examples", "rbac", "eval.yaml")}, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(objs).To(HaveLen(1))
		role := objs[0].Unstructured.DeepCopy()
		role.SetName(prefix + role.GetName())
		create(role)
		user := prefix + "admin"
		create(&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: prefix + "eval"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.GetName()},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: user}},
		})
		asUser, stderr, code := runEval("--kubeconfig", impersonatingKubeconfig(user))
		Expect(code).To(Equal(0), stderr)
		asAdmin, stderr, code := runEval("--kubeconfig", kubeconfig)
		Expect(code).To(Equal(0), stderr)
		Expect(asUser).To(MatchJSON(asAdmin))

		_, stderr, code = runEval("--kubeconfig", impersonatingKubeconfig(prefix+"nobody"))
		Expect(code).NotTo(Equal(0))
		Expect(stderr).To(ContainSubstring("forbidden"))
		Expect(stderr).To(ContainSubstring("examples/rbac/eval.yaml"))
	})
})
