package kubevirt_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/live"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// dumpArchiveFinalizer is the finalizer of a tool that archives finished migrations, which
// the spec below stands in for: see "history" there.
const dumpArchiveFinalizer = "dump.virt-rules.test/archive"

// dumpEvalReport is the part of `eval -o json` the spec below reads by name (the whole report
// is compared).
type dumpEvalReport struct {
	MigrationPolicies []struct {
		VMI            string  `json:"vmi"`
		Phase          string  `json:"phase"`
		Policy         *string `json:"policy"`
		MatchingLabels int     `json:"matchingLabels"`
	} `json:"migrationPolicies"`
	MigrationTargets []struct {
		Migration          string   `json:"migration"`
		VMI                string   `json:"vmi"`
		Phase              string   `json:"phase"`
		CandidateNodes     []string `json:"candidateNodes"`
		TargetNodeAffinity any      `json:"targetNodeAffinity"`
		Error              any      `json:"error"`
	} `json:"migrationTargets"`
	Errors []manifest.Error `json:"errors"`
}

// The cluster's dump as a user makes one (`kubectl get <every kind eval reads> -A -o yaml`,
// one `kind: List`) and the cluster itself (`eval --kubeconfig`) must give the same report,
// objects in error included, for state left behind as a KubeVirt cluster leaves it.
var _ = Describe("virt-rules eval of a cluster dump beside KubeVirt", Label("eval"), Ordered, func() {
	var binary, ns, bare string

	// What a bad policy gets, from the rules' validation (rego/virtrules/migration/policy/
	// validation: label values). KubeVirt admits it: its CRD's selectors are maps of strings
	// and its migration-policy webhook checks only negative settings.
	const (
		badPolicy  = "dump-ops-owned"
		badField   = "spec.selectors.virtualMachineInstanceSelector.dump-owner"
		badMessage = `label "dump-owner": value "ops team" must be empty or letters, digits, '-', '_' and '.', starting and ending with a letter or digit`
	)

	BeforeAll(func(sctx SpecContext) {
		binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")

		// Policies as an admin writes them: two valid ones, and one that only virt-rules
		// refuses, stored while virt-rules' validating webhook was not installed (as policies
		// made before virt-rules was: its webhook would refuse it).
		for _, doc := range []string{
			`{apiVersion: migrations.kubevirt.io/v1alpha1, kind: MigrationPolicy, metadata: {name: dump-gold},
			  spec: {selectors: {namespaceSelector: {dump-tier: gold}}, allowPostCopy: true, bandwidthPerMigration: 1Gi}}`,
			`{apiVersion: migrations.kubevirt.io/v1alpha1, kind: MigrationPolicy, metadata: {name: dump-db},
			  spec: {selectors: {namespaceSelector: {dump-tier: gold}, virtualMachineInstanceSelector: {app: db}}, bandwidthPerMigration: 64Mi, completionTimeoutPerGiB: 300}}`,
		} {
			p := fromYAML(doc)
			Expect(k8s.Create(ctx, p)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, p))).To(Succeed()) })
		}
		bad := fromYAML(`{apiVersion: migrations.kubevirt.io/v1alpha1, kind: MigrationPolicy, metadata: {name: ` + badPolicy + `},
		  spec: {selectors: {virtualMachineInstanceSelector: {dump-owner: ops team}}, allowAutoConverge: true}}`)
		Expect(k8s.Create(ctx, bad.DeepCopy(), client.DryRunAll)).To(MatchError(ContainSubstring(`value "ops team"`)), "virt-rules' webhook refuses it")
		validating := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "virt-rules-validating"}, validating)).To(Succeed())
		Expect(k8s.Delete(ctx, validating)).To(Succeed())
		validating.ResourceVersion, validating.UID = "", ""
		restore := func() {
			if err := k8s.Create(ctx, validating.DeepCopy()); !apierrors.IsAlreadyExists(err) {
				Expect(err).NotTo(HaveOccurred())
			}
		}
		DeferCleanup(restore)
		// The API server drops a deleted webhook configuration from its cache a moment later.
		Eventually(func() error { return k8s.Create(ctx, bad.DeepCopy()) }).Should(Succeed(), "KubeVirt admits %s", badPolicy)
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, bad))).To(Succeed()) })
		restore()
		// Back in force before anything else is created.
		Eventually(func() error {
			probe := bad.DeepCopy()
			probe.SetName("dump-probe")
			return k8s.Create(ctx, probe, client.DryRunAll)
		}).Should(MatchError(ContainSubstring(`value "ops team"`)))

		// VMs as a user makes them: a namespace with labels, and one without (only the
		// kubernetes.io/metadata.name label the API server gives every namespace).
		ns = namespace(map[string]string{"dump-tier": "gold"})
		bare = namespace(nil)
		runningVM(ns, "web", "")
		runningVM(ns, "db", "")
		runningVM(bare, "sandbox", "")

		// History: a VM migrated twice, then deleted. The phases are written by the cluster's
		// own components, none by this spec: old-move Succeeded through KubeVirt's
		// virt-controller and the virt-handler stand-in; old-nowhere, to a node that does not
		// exist, Failed by virt-rules' migration target controller (NodeNotFound), as in
		// migrationtarget_test.go.
		runningVM(ns, "old", "")
		migrate(ns, "old-move", "old", nil, nil)
		Eventually(targetOutcome(ns, "old-move")).Should(HaveKeyWithValue("phase", "Succeeded"))
		migrate(ns, "old-nowhere", "old", toNode("node-9"), nil)
		Eventually(targetOutcome(ns, "old-nowhere")).Should(And(
			HaveKeyWithValue("phase", "Failed"), HaveKeyWithValue("reason", engine.ReasonNodeNotFound)))
		// KubeVirt v1.8's virt-controller deletes every migration of a VMI that is gone,
		// finished ones too (pkg/virt-controller/watch/migration: "Deleting migration for
		// deleted vmi"): finished migrations of deleted VMIs stay in a cluster only while
		// something else holds them. Here the finalizer of a tool archiving them, put on as
		// such a tool would (metadata only), and taken off when the spec ends.
		for _, name := range []string{"old-move", "old-nowhere"} {
			Eventually(func(g Gomega) {
				m := get(migrationKind, ns, name)(g)
				g.Expect(m.GetFinalizers()).To(BeEmpty(), "virt-controller removes its own from a finished migration")
				m.SetFinalizers([]string{dumpArchiveFinalizer})
				g.Expect(k8s.Update(ctx, m)).To(Succeed())
			}).Should(Succeed())
			DeferCleanup(func() {
				Eventually(func(g Gomega) {
					m := &unstructured.Unstructured{}
					m.SetGroupVersionKind(migrationKind.GroupVersionKind())
					err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m)
					if apierrors.IsNotFound(err) {
						return
					}
					g.Expect(err).NotTo(HaveOccurred())
					m.SetFinalizers(slices.DeleteFunc(m.GetFinalizers(), func(f string) bool { return f == dumpArchiveFinalizer }))
					g.Expect(client.IgnoreNotFound(k8s.Update(ctx, m))).To(Succeed())
				}).Should(Succeed())
			})
		}
		vm := kinds.NewObject(kinds.VirtualMachine)
		vm.SetNamespace(ns)
		vm.SetName("old")
		Expect(k8s.Delete(ctx, vm)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "old"}, kinds.NewObject(kinds.VirtualMachineInstance)))
		}).Should(BeTrue(), "VMI old deleted")
		for _, name := range []string{"old-move", "old-nowhere"} {
			Eventually(func(g Gomega) *metav1.Time {
				return get(migrationKind, ns, name)(g).GetDeletionTimestamp()
			}).ShouldNot(BeNil(), "virt-controller deletes migration %s of the deleted VMI", name)
		}

		// The controllers have written what they write about these objects.
		Eventually(annotationsOf(badPolicy)).Should(HaveKeyWithValue(migrationpolicy.AnnotationValid, "false"))
		for vmi, policy := range map[string]string{"web": "dump-gold", "db": "dump-db"} {
			Eventually(func(g Gomega) map[string]string {
				return get(vmiKind, ns, vmi)(g).GetAnnotations()
			}).Should(HaveKeyWithValue(migrationpolicy.AnnotationPolicy, policy), vmi)
		}
	}, NodeTimeout(10*time.Minute))

	It("reports the same for `kubectl get -A -o yaml` of the cluster as for the cluster, errors included", func() {
		dir := GinkgoT().TempDir()
		var (
			dumpPath           string
			items              []map[string]any
			fileOut, liveOut   string
			fileCode, liveCode int
			fileErr, liveErr   string
		)
		// Each attempt dumps the cluster and reads it live at once, with the same flags: the
		// cluster is still moving (controllers and KubeVirt write status and annotations, kwok
		// heartbeats), so an attempt whose cluster changed between the two reads is tried
		// again. --drift is eval --kubeconfig's own default, given to both; --now is one time
		// for both (pool plans read it).
		attempt := 0
		Eventually(func(g Gomega) {
			attempt++
			dumpPath = filepath.Join(dir, fmt.Sprintf("cluster-%d.yaml", attempt))
			items = dumpClusterList(g, dumpPath)
			now := time.Now().UTC().Format(time.RFC3339)
			flags := []string{"-o", "json", "--drift", "--now", now}
			fileOut, fileErr, fileCode = runDumpEval(g, binary, append(flags, dumpPath)...)
			liveOut, liveErr, liveCode = runDumpEval(g, binary, append(flags, "--kubeconfig", cluster.Kubeconfig)...)
			g.Expect(fileCode).To(Equal(1), "eval FILE: some objects in error\n%s", fileErr)
			g.Expect(liveCode).To(Equal(1), "eval --kubeconfig: some objects in error\n%s", liveErr)
			file := normalisedDumpReport(g, fileOut, func(e map[string]any) {
				// FILE:LINE, the line of the field at fault in the dump; and the field's path in
				// the document, items[N]. and the path in the object, N the object's index.
				loc, _ := e["location"].(string)
				g.Expect(loc).To(MatchRegexp(`^%s:[0-9]+$`, regexp.QuoteMeta(dumpPath)), "location of %v", e)
				e["location"] = live.Source
				f, _ := e["field"].(string)
				m := regexp.MustCompile(`^items\[([0-9]+)\]\.?`).FindStringSubmatch(f)
				g.Expect(m).NotTo(BeNil(), "field of %v", e)
				n, _ := strconv.Atoi(m[1])
				g.Expect(n).To(BeNumerically("<", len(items)))
				meta, _ := items[n]["metadata"].(map[string]any)
				g.Expect([]any{items[n]["kind"], meta["namespace"], meta["name"]}).To(Equal([]any{e["kind"], e["namespace"], e["name"]}), "items[%d] is the object of %v", n, e)
				if rest := f[len(m[0]):]; rest != "" {
					e["field"] = rest
				} else {
					delete(e, "field")
				}
			})
			fromCluster := normalisedDumpReport(g, liveOut, func(e map[string]any) {
				g.Expect(e["location"]).To(Equal(live.Source), "location of %v", e)
			})
			g.Expect(fromCluster).To(MatchJSON(file), "eval --kubeconfig (actual) against eval of the dump (expected), normalised")
		}).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		AddReportEntry("attempts", attempt)

		// The dump is kubectl's: one List, managedFields and status kept.
		data, err := os.ReadFile(dumpPath)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).To(And(HavePrefix("apiVersion: v1\n"), ContainSubstring("\nkind: List\n"), ContainSubstring("managedFields:")))

		for _, run := range []struct {
			name, out string
			live      bool
		}{{"eval FILE", fileOut, false}, {"eval --kubeconfig", liveOut, true}} {
			By("reading the report of " + run.name)
			var r dumpEvalReport
			Expect(json.Unmarshal([]byte(run.out), &r)).To(Succeed())
			// The flagged policy's error, and no other about this spec's objects.
			var ours []manifest.Error
			for _, e := range r.Errors {
				if e.Namespace == ns || e.Namespace == bare || strings.HasPrefix(e.Name, "dump-") {
					ours = append(ours, e)
				}
			}
			Expect(ours).To(HaveLen(1), "errors about this spec's objects: %v", ours)
			Expect(ours[0]).To(dumpPolicyError(badPolicy, badField, badMessage))
			if run.live {
				Expect(ours[0].Location).To(Equal("cluster"))
				Expect(ours[0].Field).To(Equal(badField))
			} else {
				// The line of the field at fault, in the document's items.
				Expect(ours[0].Field).To(MatchRegexp(`^items\[[0-9]+\]\.` + regexp.QuoteMeta(badField) + `$`))
				line, err := strconv.Atoi(ours[0].Location[strings.LastIndexByte(ours[0].Location, ':')+1:])
				Expect(err).NotTo(HaveOccurred())
				lines := strings.Split(string(data), "\n")
				Expect(line).To(BeNumerically("<=", len(lines)))
				Expect(lines[line-1]).To(ContainSubstring("dump-owner: ops team"), "%s", ours[0].Location)
			}

			// The finished migrations of the deleted VMI: history, with their phase, no target
			// decision, no error.
			targets := map[string]any{}
			for _, t := range r.MigrationTargets {
				targets[t.Migration] = t
			}
			for name, phase := range map[string]string{"old-move": "Succeeded", "old-nowhere": "Failed"} {
				Expect(targets).To(HaveKeyWithValue(ns+"/"+name, And(
					HaveField("VMI", ns+"/old"), HaveField("Phase", phase),
					HaveField("CandidateNodes", BeNil()), HaveField("TargetNodeAffinity", BeNil()), HaveField("Error", BeNil()))))
			}

			// Every VMI decided: the one in the namespace without labels by no policy, the
			// others by theirs; the deleted one is not there.
			policies := map[string]any{}
			for _, p := range r.MigrationPolicies {
				policies[p.VMI] = p
			}
			Expect(policies).To(HaveKeyWithValue(bare+"/sandbox", And(HaveField("Policy", BeNil()), HaveField("MatchingLabels", 0), HaveField("Phase", ""))))
			Expect(policies).To(HaveKeyWithValue(ns+"/web", HaveField("Policy", HaveValue(Equal("dump-gold")))))
			Expect(policies).To(HaveKeyWithValue(ns+"/db", And(HaveField("Policy", HaveValue(Equal("dump-db"))), HaveField("MatchingLabels", 2))))
			Expect(policies).NotTo(HaveKey(ns + "/old"))
		}
		Expect(fileErr).To(ContainSubstring(": MigrationPolicy " + badPolicy + ": items["))
		Expect(liveErr).To(ContainSubstring("error: cluster: MigrationPolicy " + badPolicy + ": " + badField + ": "))
	})
})

// dumpPolicyError matches the manifest.Error of the MigrationPolicy name at field (any location,
// any items[N]. prefix) with message.
func dumpPolicyError(name, field, message string) OmegaMatcher {
	return And(
		HaveField("Kind", "MigrationPolicy"), HaveField("Namespace", ""), HaveField("Name", name),
		HaveField("Field", HaveSuffix(field)), HaveField("Message", message), HaveField("Reason", manifest.ReasonInvalid))
}

// dumpClusterList writes to path what `kubectl get <kinds> -A -o yaml` prints of every kind
// eval reads (live.Resources, in that order), and returns its items: one `kind: List`
// (apiVersion v1, metadata.resourceVersion ""), each item with its apiVersion and kind set as
// kubectl sets them, managedFields and status kept, keys sorted. A kind is listed at the
// version eval asks for, or else at a version of its group the cluster serves; a kind the
// cluster does not serve has no items (eval --kubeconfig warns). Like kubectl, it lists every
// object of each kind, without eval's selectors: eval leaves out terminated pods from files
// itself, and this cluster serves no DataVolumes (suite_test.go).
func dumpClusterList(g Gomega, path string) []map[string]any {
	dyn, err := dynamic.NewForConfig(cluster.Config)
	g.Expect(err).NotTo(HaveOccurred())
	dc, err := discovery.NewDiscoveryClientForConfig(cluster.Config)
	g.Expect(err).NotTo(HaveOccurred())
	var items []map[string]any
	for _, res := range live.Resources {
		gvr := res.GroupVersionResource
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			// Another version of the group, as kubectl finds one (eval reads any version).
			var served bool
			if gvr, served = dumpServedVersion(g, dc, gvr); served {
				list, err = dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
			}
		}
		if apierrors.IsNotFound(err) {
			continue
		}
		g.Expect(err).NotTo(HaveOccurred(), res.Resource)
		for i := range list.Items {
			item := &list.Items[i]
			item.SetAPIVersion(gvr.GroupVersion().String())
			item.SetKind(res.Kind)
			items = append(items, item.Object)
		}
	}
	data, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "List", "items": items, "metadata": map[string]any{"resourceVersion": ""},
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(path, data, 0o644)).To(Succeed())
	return items
}

// dumpServedVersion is gvr at the group's preferred version that serves its resource, when
// the cluster serves the group at all.
func dumpServedVersion(g Gomega, dc discovery.DiscoveryInterface, gvr schema.GroupVersionResource) (schema.GroupVersionResource, bool) {
	groups, err := dc.ServerGroups()
	g.Expect(err).NotTo(HaveOccurred())
	for _, group := range groups.Groups {
		if group.Name != gvr.Group {
			continue
		}
		versions := append([]metav1.GroupVersionForDiscovery{group.PreferredVersion}, group.Versions...)
		for _, v := range versions {
			resources, err := dc.ServerResourcesForGroupVersion(v.GroupVersion)
			if apierrors.IsNotFound(err) {
				continue
			}
			g.Expect(err).NotTo(HaveOccurred())
			for _, r := range resources.APIResources {
				if r.Name == gvr.Resource {
					return gvr.GroupResource().WithVersion(v.Version), true
				}
			}
		}
	}
	return gvr, false
}

// runDumpEval runs the binary's eval with args: stdout, stderr and the exit status.
func runDumpEval(g Gomega, binary string, args ...string) (string, string, int) {
	stdout, stderr, code, err := clustersuite.RunBinary(ctx, binary, append([]string{"eval"}, args...)...)
	g.Expect(err).NotTo(HaveOccurred(), "eval %v", args)
	return stdout, stderr, code
}

// normalisedDumpReport is the `eval -o json` report out as JSON, its errors normalised, and
// nothing else. What legitimately differs between a dump and the cluster, and only that:
//   - location: FILE:LINE of the dump, "cluster" live (located makes it "cluster", after
//     checking the line is the dump's);
//   - field: "items[N]." before the object's path in a `kind: List` file, none live (located
//     strips it, after checking items[N] is the object named);
//   - the order of the errors: sorted by location (file, then line) with the rest after, so a
//     file's by line, the cluster's (one location) by object: sorted here by object, field and
//     message alike.
//
// Everything else, every decision, the drift and every error's kind, name, message and
// reason, must be the same.
func normalisedDumpReport(g Gomega, out string, located func(e map[string]any)) string {
	var r map[string]any
	g.Expect(json.Unmarshal([]byte(out), &r)).To(Succeed(), out)
	errs, ok := r["errors"].([]any)
	g.Expect(ok).To(BeTrue(), "errors is a list: %s", out)
	for _, e := range errs {
		located(e.(map[string]any))
	}
	key := func(e any) string {
		m := e.(map[string]any)
		return fmt.Sprint(m["kind"], "\x00", m["namespace"], "\x00", m["name"], "\x00", m["field"], "\x00", m["message"], "\x00", m["reason"])
	}
	slices.SortStableFunc(errs, func(a, b any) int { return cmp.Compare(key(a), key(b)) })
	data, err := json.MarshalIndent(r, "", "  ")
	g.Expect(err).NotTo(HaveOccurred())
	return string(data)
}
