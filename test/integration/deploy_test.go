package integration_test

import (
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

var _ = Describe("examples/deploy", Ordered, func() {
	var objs []manifest.Object

	BeforeAll(func() {
		var err error
		objs, err = manifest.Read([]string{
			filepath.Join(repoRoot, "examples", "deploy", "base", "namespace.yaml"),
			filepath.Join(repoRoot, "examples", "deploy", "base", "rbac.yaml"),
			filepath.Join(repoRoot, "examples", "deploy", "base", "controller.yaml"),
			filepath.Join(repoRoot, "examples", "deploy", "webhooks", "validating.yaml"),
			filepath.Join(repoRoot, "examples", "deploy", "webhooks", "mutating.yaml"),
		}, nil)
		Expect(err).NotTo(HaveOccurred())
	})

	It("is accepted by the API server (server-side dry run for the workload and webhooks)", func() {
		for _, o := range objs {
			switch o.GetKind() {
			case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
				Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, o.Unstructured.DeepCopy()))).To(Succeed(), o.Describe())
			default:
				Expect(k8sClient.Create(ctx, o.Unstructured.DeepCopy(), client.DryRunAll)).To(Succeed(), o.Describe())
			}
		}
	})

	It("grants the controller all it needs: it works as its service account", func() {
		// The control: RBAC is enforced, so an identity without bindings may not even list VMIs.
		nobody := rest.CopyConfig(cfg)
		nobody.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:virt-rules:nobody"}
		nobodyClient, err := client.New(nobody, client.Options{})
		Expect(err).NotTo(HaveOccurred())
		vmis := &unstructured.UnstructuredList{}
		vmis.SetGroupVersionKind(migrationpolicy.GVKVirtualMachineInstance.GroupVersion().WithKind("VirtualMachineInstanceList"))
		Expect(apierrors.IsForbidden(nobodyClient.List(ctx, vmis))).To(BeTrue(), "RBAC must be enforced for this test to mean anything")

		asController := rest.CopyConfig(cfg)
		asController.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:virt-rules:virt-rules"}
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		Expect(k8sClient.Create(ctx, policyObject("rbac-test", map[string]any{"role": "rbac"}, nil))).To(Succeed())
		DeferCleanup(func() {
			Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		})
		ns := createNamespace()
		createVMI(ns, "vm", map[string]string{"role": "rbac"})

		leaseNS := "virt-rules"
		stop, elected := startManagerOpts(asController, nil, &leaseNS)
		DeferCleanup(stop)
		Eventually(elected).WithTimeout(20 * time.Second).Should(BeClosed())
		Eventually(policyOf(vmiKey(ns, "vm"))).WithTimeout(20 * time.Second).Should(Equal("rbac-test"))
		Eventually(func(g Gomega) {
			p := newUnstructured(migrationpolicy.GVKMigrationPolicy)
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Name: "rbac-test"}, p)).To(Succeed())
			g.Expect(p.GetAnnotations()).To(HaveKeyWithValue(migrationpolicy.AnnotationVMIs, "1"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func() map[string]int { return policyEvents(ns) }).WithTimeout(10 * time.Second).Should(HaveKeyWithValue("vm", 1))
	})
})
