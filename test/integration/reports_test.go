package integration_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/controllers/reports"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// openReportsCRDs are the OpenReports CRD files of the module go.mod requires, read where the
// Go toolchain keeps it (never copied into this repository).
func openReportsCRDs() []string {
	GinkgoHelper()
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-json", "github.com/openreports/reports-api")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "go list -m github.com/openreports/reports-api")
	var mod struct{ Dir string }
	Expect(json.Unmarshal(out, &mod)).To(Succeed())
	Expect(mod.Dir).NotTo(BeEmpty(), "the module is downloaded (go mod download)")
	dir := filepath.Join(mod.Dir, "config", "crd")
	return []string{filepath.Join(dir, "openreports.io_reports.yaml"), filepath.Join(dir, "openreports.io_clusterreports.yaml")}
}

// uninstallOpenReportsCRDs deletes the OpenReports CRDs and waits until the API server no
// longer serves them: envtest.UninstallCRDs returns when the deletes are accepted, while the API
// server still removes the CRDs' objects and then the group from discovery, and a spec that
// needs the CRDs absent may run next.
func uninstallOpenReportsCRDs() {
	GinkgoHelper()
	Expect(envtest.UninstallCRDs(cfg, envtest.CRDInstallOptions{Paths: openReportsCRDs()})).To(Succeed())
	Eventually(openReportsServed).WithTimeout(time.Minute).Should(BeFalse(), "the OpenReports CRDs are still served")
}

// openReportsServed tells whether the API server serves the OpenReports kinds now, as the
// reports controller asks it (reports.Available), through a REST mapper of its own so that
// no earlier answer is cached.
func openReportsServed() (bool, error) {
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, must(rest.HTTPClientFor(cfg)))
	if err != nil {
		return false, fmt.Errorf("REST mapper: %w", err)
	}
	return reports.Available(mapper)
}

// storedReport is the report of kind gvk named virt-rules in ns ("" for the ClusterReport),
// decoded, and the size of its stored JSON.
func storedReport(g Gomega, ns string, cluster bool) (*openreports.Report, int) {
	gvk := reports.GVKReport
	if cluster {
		gvk = reports.GVKClusterReport
	}
	u := newUnstructured(gvk)
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: reports.Name}, u)).To(Succeed())
	data, err := u.MarshalJSON()
	g.Expect(err).NotTo(HaveOccurred())
	var r openreports.Report
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r)).To(Succeed())
	return &r, len(data)
}

// resultRows are a report's results as "result policy rule subject props" lines.
func resultRows(r *openreports.Report) []string {
	var rows []string
	for _, res := range r.Results {
		subject := ""
		if len(res.Subjects) > 0 {
			subject = res.Subjects[0].Kind + "/" + res.Subjects[0].Name
		}
		rows = append(rows, fmt.Sprintf("%s %s %s %s %v", res.Result, res.Policy, res.Rule, subject, res.Properties))
	}
	return rows
}

var _ = Describe("Reports (OpenReports)", Ordered, func() {
	var (
		ns        string
		stop      func()
		installed bool
	)
	vmi := func(name string, labels map[string]string) {
		GinkgoHelper()
		v := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		v.SetNamespace(ns)
		v.SetName(name)
		v.SetLabels(labels)
		v.Object["spec"] = map[string]any{"domain": map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "1", "memory": "2Gi"}}, "devices": map[string]any{}}}
		v.Object["status"] = map[string]any{"nodeName": "rep-sky-1"}
		create(v)
	}

	BeforeAll(func() {
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		DeferCleanup(func() {
			Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		})
		ns = createNamespace()
		skylake := cpuNode("rep-sky-1", "Skylake", []string{"Skylake"}, []string{"avx512f"}, []string{"avx512f"})
		skylake.Labels["kubevirt.io/schedulable"] = "true"
		create(skylake)
		create(cpuNode("rep-ice-1", "Icelake", []string{"Skylake", "Icelake"}, []string{"avx512f", "gfni"}, []string{"gfni"}))
		create(policyObject("report-gold", map[string]any{"role": "gold"}, nil))
		create(policyObject("report-silver", map[string]any{"role": "silver"}, nil))
		create(policyObject("report-bad", map[string]any{"role": "none-such"}, map[string]any{"completionTimeoutPerGiB": int64(-5)}))
		for i := range 3 {
			vmi(fmt.Sprintf("gold-%d", i), map[string]string{"role": "gold"})
		}
		vmi("silver-0", map[string]string{"role": "silver"})
		vmi("plain", nil)
		// A migration to a node that does not exist (NodeNotFound) and one whose term names a
		// field nodes cannot be selected by (InvalidTerm: no webhook refuses it here).
		migration(ns, "to-missing", "plain", toNode("rep-node-9"))
		migration(ns, "bad-term", "plain", map[string]any{
			"matchFields": []any{map[string]any{"key": "metadata.labels", "operator": "In", "values": []any{"x"}}},
		})
	})

	AfterAll(func() {
		if stop != nil {
			stop()
		}
		if installed {
			uninstallOpenReportsCRDs()
		}
	})

	It("without the OpenReports CRDs, leaves the other controllers running", func() {
		Expect(openReportsServed()).To(BeFalse(), "this spec installs the CRDs itself; none may be there yet")
		stop := startManager()
		defer stop()
		Eventually(policyOf(vmiKey(ns, "gold-0"))).Should(Equal("report-gold"))
		Eventually(targetCondition(ns, "to-missing")).Should(HaveKeyWithValue("reason", engine.ReasonNodeNotFound))
		Eventually(targetCondition(ns, "bad-term")).Should(HaveKeyWithValue("reason", engine.ReasonInvalidTerm))
	})

	// running installs the CRDs and starts virt-rules once, so that each spec below also runs
	// on its own (focused).
	running := func() {
		GinkgoHelper()
		if !installed {
			_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: openReportsCRDs(), ErrorIfPathMissing: true})
			Expect(err).NotTo(HaveOccurred())
			installed = true
		}
		if stop == nil {
			stop = startManager()
		}
	}

	It("with the CRDs installed from the reports-api module, writes the namespace's Report", func() {
		running()

		Eventually(func(g Gomega) {
			r, size := storedReport(g, ns, false)
			g.Expect(r.Labels).To(HaveKeyWithValue(reports.LabelManagedBy, reports.ManagedBy))
			g.Expect(r.Source).To(Equal(reports.Source))
			g.Expect(resultRows(r)).To(Equal([]string{
				"error migration-target InvalidTerm VirtualMachineInstanceMigration/bad-term map[reason:InvalidTerm virtualMachineInstance:plain]",
				"fail migration-target NodeNotFound VirtualMachineInstanceMigration/to-missing map[reason:NodeNotFound virtualMachineInstance:plain]",
				"pass migration-policy report-gold MigrationPolicy/report-gold map[migrationPolicy:report-gold virtualMachineInstances:3]",
				"pass migration-policy report-silver MigrationPolicy/report-silver map[migrationPolicy:report-silver virtualMachineInstances:1]",
				"skip migration-policy <none>  map[virtualMachineInstances:1]",
			}))
			g.Expect(r.Results[1].Description).To(ContainSubstring("node rep-node-9 does not exist"))
			g.Expect(r.Results[1].Timestamp.Seconds).NotTo(BeZero())
			g.Expect(r.Summary).To(Equal(openreports.ReportSummary{Pass: 2, Fail: 1, Error: 1, Skip: 1}))
			g.Expect(r.Annotations).NotTo(HaveKey(reports.AnnotationOmitted))
			g.Expect(size).To(BeNumerically("<", 16<<10))
		}).WithTimeout(40 * time.Second).Should(Succeed())
	})

	It("writes the ClusterReport: every MigrationPolicy valid or not, nodes per migratability level, the CPU baseline", func() {
		running()
		for _, n := range []string{"rep-sky-1", "rep-ice-1"} {
			Eventually(levelOf(n)).ShouldNot(Equal("<none>"))
		}
		// The levels as the nodelabeller wrote them, counted here from the nodes.
		var nodes corev1.NodeList
		Expect(k8sClient.List(ctx, &nodes)).To(Succeed())
		levels := map[string]int{}
		for _, n := range nodes.Items {
			levels[n.Labels[nodelabeller.LabelLevel]]++
		}
		Eventually(func(g Gomega) {
			r, _ := storedReport(g, "", true)
			g.Expect(r.Labels).To(HaveKeyWithValue(reports.LabelManagedBy, reports.ManagedBy))
			rows := map[string]string{}
			got := map[string]int{}
			for _, res := range r.Results {
				rows[res.Policy+" "+res.Rule] = string(res.Result) + ": " + res.Description
				if res.Policy == reports.PolicyNodeMigratability {
					n, err := strconv.Atoi(res.Properties["nodes"])
					g.Expect(err).NotTo(HaveOccurred())
					got[res.Properties["level"]] = n
				}
			}
			g.Expect(rows).To(HaveKeyWithValue("migration-policy-validation report-bad", And(HavePrefix("fail: "), ContainSubstring("completionTimeoutPerGiB"))))
			g.Expect(rows).To(HaveKeyWithValue("migration-policy-validation report-gold", "pass: MigrationPolicy report-gold is valid"))
			g.Expect(rows).To(HaveKeyWithValue("migration-policy-validation report-silver", "pass: MigrationPolicy report-silver is valid"))
			g.Expect(got).To(Equal(levels))
			// The CPU baseline of the cluster's nodes, one result for the one group: a CPU to
			// pin (pass) or why there is none (warn).
			g.Expect(rows).To(HaveKeyWithValue("cpu-baseline all-nodes", Or(HavePrefix("pass: every one of the"), HavePrefix("warn: "))))
			g.Expect(r.Summary.Fail).To(Equal(1))
			g.Expect(r.Summary.Pass + r.Summary.Fail + r.Summary.Skip + r.Summary.Warn).To(Equal(len(r.Results)))
		}).Should(Succeed())
	})

	It("follows changes, and writes nothing when nothing changed", func() {
		running()
		v := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		v.SetNamespace(ns)
		v.SetName("silver-0")
		Expect(k8sClient.Delete(ctx, v)).To(Succeed())
		var rv string
		Eventually(func(g Gomega) {
			r, _ := storedReport(g, ns, false)
			g.Expect(resultRows(r)).NotTo(ContainElement(ContainSubstring("report-silver")))
			g.Expect(r.Summary).To(Equal(openreports.ReportSummary{Pass: 1, Fail: 1, Error: 1, Skip: 1}))
			rv = r.ResourceVersion
		}).Should(Succeed())

		// Events that change nothing reported: a migration touched, a VMI relabelled into the
		// same policy.
		m := newUnstructured(migrationtarget.GVKMigration)
		m.SetNamespace(ns)
		m.SetName("to-missing")
		patchLabels(m, map[string]any{"touched": "yes"})
		v.SetName("gold-0")
		patchLabels(v, map[string]any{"unrelated": "yes"})
		Consistently(func(g Gomega) string {
			r, _ := storedReport(g, ns, false)
			return r.ResourceVersion
		}).WithTimeout(4 * time.Second).Should(Equal(rv))
	})

	It("removes a namespace's Report once there is nothing to report", func() {
		running()
		other := createNamespace()
		v := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		v.SetNamespace(other)
		v.SetName("lonely")
		v.Object["spec"] = map[string]any{"domain": map[string]any{"devices": map[string]any{}}}
		Expect(k8sClient.Create(ctx, v)).To(Succeed())
		Eventually(func(g Gomega) { storedReport(g, other, false) }).Should(Succeed())
		Expect(k8sClient.Delete(ctx, v)).To(Succeed())
		Eventually(func() bool {
			err := k8sClient.Get(ctx, types.NamespacedName{Namespace: other, Name: reports.Name}, newUnstructured(reports.GVKReport))
			return apierrors.IsNotFound(err)
		}).Should(BeTrue())
	})

	It("keeps a Report with many failed migrations under 1 MiB, its summary exact", func() {
		running()
		big := createNamespace()
		const n = 1000
		// Failures as the migrationtarget controller records them (no added term: it leaves
		// these migrations alone), with long messages.
		message := "no node is left: " + strings.Repeat("node-x excluded by the added term; ", 30)
		work := make(chan int)
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range 8 {
			wg.Go(func() {
				defer GinkgoRecover()
				for i := range work {
					m := newUnstructured(migrationtarget.GVKMigration)
					m.SetNamespace(big)
					m.SetName(fmt.Sprintf("m-%04d", i))
					m.Object["spec"] = map[string]any{"vmiName": "v"}
					if err := k8sClient.Create(ctx, m); err != nil {
						errs <- err
						continue
					}
					patch := map[string]any{"status": map[string]any{"phase": migrationtarget.PhaseFailed, "conditions": []any{map[string]any{
						"type": migrationtarget.ConditionTargetAvailable, "status": "False", "reason": engine.ReasonNoMatchingNode,
						"message": message, "lastTransitionTime": "2026-11-27T12:00:00Z",
					}}}}
					data, _ := json.Marshal(patch)
					errs <- k8sClient.Status().Patch(ctx, m, client.RawPatch(types.MergePatchType, data))
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		close(errs)
		for err := range errs {
			Expect(err).NotTo(HaveOccurred())
		}
		DeferCleanup(func() {
			Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationtarget.GVKMigration), client.InNamespace(big))).To(Succeed())
		})

		Eventually(func(g Gomega) {
			r, size := storedReport(g, big, false)
			g.Expect(r.Summary).To(Equal(openreports.ReportSummary{Fail: n}))
			omitted, err := strconv.Atoi(r.Annotations[reports.AnnotationOmitted])
			g.Expect(err).NotTo(HaveOccurred(), "the %s annotation", reports.AnnotationOmitted)
			g.Expect(omitted).To(BeNumerically(">", 0))
			g.Expect(len(r.Results) + omitted).To(Equal(n))
			g.Expect(size).To(BeNumerically("<=", reports.MaxBytes))
			g.Expect(size).To(BeNumerically(">", reports.MaxBytes/2), "the budget is used")
			GinkgoWriter.Printf("report of %d failed migrations: %d bytes stored, %d results kept, %d omitted\n", n, size, len(r.Results), omitted)
		}).WithTimeout(60 * time.Second).Should(Succeed())
	})

	It("works with the deploy RBAC, as the controller's service account", func() {
		running()
		objs, err := manifest.Read([]string{filepath.Join(repoRoot, "examples", "deploy", "base", "rbac.yaml")}, nil)
		Expect(err).NotTo(HaveOccurred())
		for _, o := range objs {
			if o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" {
				Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, o.Unstructured.DeepCopy()))).To(Succeed(), o.Describe())
			}
		}
		stop()
		asController := rest.CopyConfig(cfg)
		asController.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:virt-rules:virt-rules"}
		stop, _ = startManagerOpts(asController, nil, nil)

		// Deleted reports come back; a change is written (create, watch, patch).
		cr := newUnstructured(reports.GVKClusterReport)
		cr.SetName(reports.Name)
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cr))).To(Succeed()) // not written yet when this spec runs alone
		Eventually(func(g Gomega) {
			r, _ := storedReport(g, "", true)
			g.Expect(r.Summary.Fail).To(Equal(1))
		}).Should(Succeed())
		v := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
		v.SetNamespace(ns)
		v.SetName("gold-2")
		Expect(k8sClient.Delete(ctx, v)).To(Succeed())
		Eventually(func(g Gomega) []string {
			r, _ := storedReport(g, ns, false)
			return resultRows(r)
		}).Should(ContainElement("pass migration-policy report-gold MigrationPolicy/report-gold map[migrationPolicy:report-gold virtualMachineInstances:2]"))
	})
})

func must[T any](v T, err error) T {
	GinkgoHelper()
	Expect(err).NotTo(HaveOccurred())
	return v
}
