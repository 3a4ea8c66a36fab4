package kubevirt_test

import (
	"cmp"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/internal/manifest"
)

// The examples an admin applies to a cluster, through every admission webhook: KubeVirt's
// schemas and validation and virt-rules'. VMIs are created (and deleted after); everything else
// is a server-side dry run. Refused objects must be the ones listed, for the reason given; the
// only "unknown field" warnings must be the ones listed.
var _ = DescribeTable("KubeVirt and virt-rules admit the example",
	func(dir string, wantWarnings []string, wantRefusals map[string]string) {
		objs, err := manifest.Read([]string{filepath.Join(repoRoot, "examples", dir)}, nil)
		Expect(err).NotTo(HaveOccurred())
		c, warnings := warnedClient()
		// Namespaces for real (a dry run needs them), with the example's labels.
		for _, o := range objs {
			ns := o.GetNamespace()
			if o.GetKind() == "Namespace" {
				ns = o.GetName()
			}
			if ns == "" || ns == "default" || ns == "kubevirt" {
				continue
			}
			n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
			if o.GetKind() == "Namespace" {
				n.Labels = o.GetLabels()
			}
			if err := k8s.Create(ctx, n); err == nil {
				DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, n))).To(Succeed()) })
			} else {
				Expect(apierrors.IsAlreadyExists(err)).To(BeTrue(), "namespace %s: %v", ns, err)
			}
		}
		// VMIs for real, first: KubeVirt admits a migration only of a VMI that exists.
		rank := func(o manifest.Object) int {
			if o.GetKind() == "VirtualMachineInstance" {
				return 0
			}
			return 1
		}
		slices.SortStableFunc(objs, func(a, b manifest.Object) int { return cmp.Compare(rank(a), rank(b)) })
		refused := map[string]string{}
		finalized := false
		for _, o := range objs {
			// A VMI the example shows running (status.nodeName: input for eval) has no launcher
			// pod here: KubeVirt finalizes it. Wait for that, so what follows sees one state.
			if o.GetKind() != "VirtualMachineInstance" && !finalized {
				finalized = true
				for _, vmi := range objs {
					if vmi.GetKind() == "VirtualMachineInstance" && field(vmi.Unstructured, "status", "nodeName") != nil {
						Eventually(func(g Gomega) any {
							return field(get(vmiKind, vmi.GetNamespace(), vmi.GetName())(g), "status", "phase")
						}).Should(BeElementOf("Failed", "Succeeded"), vmi.Describe())
					}
				}
			}
			if o.GetKind() == "Namespace" {
				continue
			}
			obj := o.Unstructured.DeepCopy()
			obj.SetUID("")
			var err error
			switch o.GetKind() {
			case "VirtualMachineInstance":
				err = c.Create(ctx, obj, client.FieldValidation("Warn"))
				if err == nil {
					DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, obj))).To(Succeed()) })
				}
			case "Node":
				// The suite's nodes have the examples' names: the example's node under another.
				obj.SetName("example-" + obj.GetName())
				fallthrough
			default:
				err = c.Create(ctx, obj, client.DryRunAll, client.FieldValidation("Warn"))
			}
			if o.GetKind() == "KubeVirt" && apierrors.IsAlreadyExists(err) {
				// The cluster's own CR has the example's name: an update is what applying does.
				current := get(obj, o.GetNamespace(), o.GetName())(Default)
				obj.SetResourceVersion(current.GetResourceVersion())
				err = c.Update(ctx, obj, client.DryRunAll, client.FieldValidation("Warn"))
			}
			if err != nil {
				refused[o.Describe()] = o.Position() + ": " + err.Error()
			}
		}
		Expect(refused).To(HaveLen(len(wantRefusals)), "refused: %v", refused)
		for object, reason := range wantRefusals {
			Expect(refused).To(HaveKeyWithValue(object, MatchRegexp(reason)))
		}
		var unknown []string
		for _, w := range warnings.texts() {
			if strings.Contains(w, "unknown field") {
				unknown = append(unknown, w)
			}
		}
		Expect(unknown).To(ConsistOf(wantWarnings))
	},
	Entry(nil, "migration-policy", nil, nil),
	Entry(nil, "migration-target", []string{`unknown field "spec.addedNodeSelectorTerm"`}, migrationTargetRefusals()),
	Entry(nil, "migratability", nil, nil),
	Entry(nil, "pool", nil, nil),
)

// migrationTargetRefusals (regular expressions): KubeVirt refuses every migration only for its
// VMI's state, after checking the migration's spec. The example's VMI is a snapshot of one
// running on node-1 (input for eval): created in a live cluster, with no launcher pod behind
// it, KubeVirt finalizes it. invalid-term is refused by virt-rules (InvalidTerm) and by
// KubeVirt alike; the API server runs validating webhooks in parallel and reports the denial
// that comes back first, so either message may be the one seen here. virt-rules' refusal of a
// malformed term, with its field path, is test/integration's webhook spec.
func migrationTargetRefusals() map[string]string {
	refusals := map[string]string{
		"VirtualMachineInstanceMigration prod/invalid-term": "InvalidTerm: |Cannot migrate VMI in finalized state",
	}
	for _, name := range []string{"to-node-2", "to-missing-node", "to-current-node", "to-silver-node", "to-full-node",
		"to-nvme", "upstream-selector", "by-annotation", "anywhere", "design-field"} {
		refusals["VirtualMachineInstanceMigration prod/"+name] = "Cannot migrate VMI in finalized state"
	}
	return refusals
}
