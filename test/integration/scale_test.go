package integration_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
)

// The scale spec (label "scale", run by `make scale`, not by `make test`): 10,000 VMIs and 100
// MigrationPolicies on the real control plane; one policy changes. It reports how long until
// every annotation is right and how many VMI writes that took, counted by a watch on VMIs (so
// every write by anyone counts), and fails if a VMI whose decision did not change was written.
var scaleVMIs = envInt("SCALE_VMIS", 10000) // a multiple of scalePolicies

const (
	scalePolicies   = 100
	scaleNamespaces = 10
	scaleWorkers    = 32
)

var gvrVMIs = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// vmiWatch follows every VMI's policy annotations and counts the writes to VMIs.
type vmiWatch struct {
	mu     sync.Mutex
	config map[string]string // ns/name -> configuration annotation
	policy map[string]string // ns/name -> policy annotation
	writes atomic.Int64      // MODIFIED events
}

func (w *vmiWatch) run(events <-chan watch.Event) {
	defer GinkgoRecover()
	for e := range events {
		u, ok := e.Object.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		key := u.GetNamespace() + "/" + u.GetName()
		if e.Type == watch.Modified {
			w.writes.Add(1)
		}
		w.mu.Lock()
		w.policy[key] = u.GetAnnotations()[migrationpolicy.AnnotationPolicy]
		w.config[key] = u.GetAnnotations()[migrationpolicy.AnnotationConfiguration]
		w.mu.Unlock()
	}
}

// wrong counts the VMIs whose policy is not want(key) or whose configuration fails ok.
func (w *vmiWatch) wrong(want func(key string) string, ok func(key, config string) bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := scaleVMIs - len(w.policy)
	for key, p := range w.policy {
		if p != want(key) || !ok(key, w.config[key]) {
			n++
		}
	}
	return n
}

// controllerIdle passes when the migrationpolicy controller has nothing queued or in progress.
func controllerIdle(g Gomega) {
	families, err := metrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	seen := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if !hasLabel(m, migrationpolicy.ControllerName) {
				continue
			}
			switch f.GetName() {
			case "workqueue_depth", "controller_runtime_active_workers":
				seen[f.GetName()] = true
				g.Expect(m.GetGauge().GetValue()).To(BeZero(), f.GetName())
			}
		}
	}
	g.Expect(seen).To(HaveLen(2), "the controller's queue depth and active workers are exported")
}

func hasLabel(m *dto.Metric, value string) bool {
	for _, l := range m.GetLabel() {
		if (l.GetName() == "name" || l.GetName() == "controller") && l.GetValue() == value {
			return true
		}
	}
	return false
}

var _ = Describe("Scale", Label("scale"), Ordered, func() {
	team := func(i int) string { return fmt.Sprintf("t%02d", i%scalePolicies) }
	var (
		namespaces []string
		teams      = map[string]string{} // ns/name -> team
		w          = &vmiWatch{config: map[string]string{}, policy: map[string]string{}}
		stop       func()
	)

	BeforeAll(func() {
		Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		DeferCleanup(func() {
			Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKMigrationPolicy))).To(Succeed())
		})
		for i := range scalePolicies {
			create(policyObject("p-"+team(i), map[string]any{"team": team(i)}, map[string]any{"bandwidthPerMigration": "64Mi"}))
		}
		for range scaleNamespaces {
			namespaces = append(namespaces, createNamespace())
		}
		start := time.Now()
		work := make(chan int)
		var wg sync.WaitGroup
		for range scaleWorkers {
			wg.Go(func() {
				defer GinkgoRecover()
				for i := range work {
					vmi := newUnstructured(migrationpolicy.GVKVirtualMachineInstance)
					vmi.SetNamespace(namespaces[i%scaleNamespaces])
					vmi.SetName(fmt.Sprintf("vmi-%05d", i))
					vmi.SetLabels(map[string]string{"team": team(i)})
					vmi.Object["spec"] = map[string]any{"domain": map[string]any{"devices": map[string]any{}}}
					Expect(k8sClient.Create(ctx, vmi)).To(Succeed())
				}
			})
		}
		for i := range scaleVMIs {
			teams[fmt.Sprintf("%s/vmi-%05d", namespaces[i%scaleNamespaces], i)] = team(i)
			work <- i
		}
		close(work)
		wg.Wait()
		fmt.Fprintf(GinkgoWriter, "created %d VMIs in %s\n", scaleVMIs, time.Since(start).Round(time.Millisecond))

		dyn, err := dynamic.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		list, err := dyn.Resource(gvrVMIs).List(ctx, metav1.ListOptions{Limit: 1})
		Expect(err).NotTo(HaveOccurred())
		watcher, err := dyn.Resource(gvrVMIs).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(watcher.Stop)
		for key := range teams { // what the watch will update: no annotation yet
			w.policy[key], w.config[key] = "", ""
		}
		go w.run(watcher.ResultChan())
	})

	AfterAll(func() {
		if stop != nil {
			stop()
		}
		for _, ns := range namespaces {
			Expect(k8sClient.DeleteAllOf(ctx, newUnstructured(migrationpolicy.GVKVirtualMachineInstance), client.InNamespace(ns))).To(Succeed())
		}
	})

	policyOfTeam := func(key string) string { return "p-" + teams[key] }
	anyConfig := func(string, string) bool { return true }

	It("annotates every VMI under 100 policies, writing each once", func() {
		start := time.Now()
		stop = startManager()
		Eventually(func() int { return w.wrong(policyOfTeam, anyConfig) }).
			WithTimeout(10 * time.Minute).WithPolling(200 * time.Millisecond).Should(BeZero())
		took := time.Since(start)
		Eventually(controllerIdle).WithTimeout(5 * time.Minute).Should(Succeed())
		writes := w.writes.Load()
		AddReportEntry("initial", fmt.Sprintf("%d VMIs annotated in %s with %d VMI writes", scaleVMIs, took.Round(time.Millisecond), writes))
		fmt.Fprintf(GinkgoWriter, "SCALE initial: %d VMIs, %d policies: every annotation right after %s, %d VMI writes\n",
			scaleVMIs, scalePolicies, took.Round(time.Millisecond), writes)
		Expect(writes).To(BeEquivalentTo(scaleVMIs), "one write per VMI")
	})

	It("re-annotates only the VMIs of the one policy that changed", func() {
		before := w.writes.Load()
		changed := "p-" + team(42)
		p := newUnstructured(migrationpolicy.GVKMigrationPolicy)
		Expect(k8sClient.Get(ctx, keyOf(changed), p)).To(Succeed())
		Expect(unstructured.SetNestedField(p.Object, "128Mi", "spec", "bandwidthPerMigration")).To(Succeed())
		start := time.Now()
		Expect(k8sClient.Update(ctx, p)).To(Succeed())
		newConfig := func(key, config string) bool {
			return (teams[key] == team(42)) == strings.Contains(config, `"bandwidthPerMigration":"128Mi"`)
		}
		Eventually(func() int { return w.wrong(policyOfTeam, newConfig) }).
			WithTimeout(5 * time.Minute).WithPolling(50 * time.Millisecond).Should(BeZero())
		took := time.Since(start)
		Eventually(controllerIdle).WithTimeout(5 * time.Minute).Should(Succeed())
		allDecided := time.Since(start)
		writes := w.writes.Load() - before
		AddReportEntry("one policy changed", fmt.Sprintf("%d VMIs right after %s (all %d re-decided after %s) with %d VMI writes",
			scaleVMIs/scalePolicies, took.Round(time.Millisecond), scaleVMIs, allDecided.Round(time.Millisecond), writes))
		fmt.Fprintf(GinkgoWriter, "SCALE policy %s changed: its %d VMIs right after %s; all %d VMIs re-decided after %s; %d VMI writes\n",
			changed, scaleVMIs/scalePolicies, took.Round(time.Millisecond), scaleVMIs, allDecided.Round(time.Millisecond), writes)
		Expect(writes).To(BeEquivalentTo(scaleVMIs/scalePolicies), "only the VMIs whose decision changed are written")
	})
})

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
