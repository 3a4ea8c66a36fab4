package scale_test

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ratioBound is how many times its floor a change may take the controller: the time from the
// change's own write until every write it causes is done, over the least the same run says
// those steps take (floor).
const ratioBound = 1.5

// changeRuns is how many times each change is made and timed, each run beside its floor
// measured right after it: the bound holds the median of the runs' ratios (pairedRun). The same
// writes' floor took from 505 to 800 ms within one run on two shared cores, and a floor taken
// after all of a change's runs drifted from theirs: one policy change took 1.03× and 1.70× its
// floor in two quiet runs of the same commit, with three runs and the floor measured after them.
// SCALE_CHANGE_RUNS sets another count: at the full size, a KubeVirt CR change of 13,000 VMI
// writes takes over a quarter of an hour a run.
var changeRuns = envInt("SCALE_CHANGE_RUNS", 5)

// pairedRun is one timed run of a change and the floor of the same writes measured right after
// it, so that both see the cluster as it was then.
type pairedRun struct {
	took  time.Duration
	floor floor
}

func (r pairedRun) ratio() float64 { return r.floor.ratio(r.took) }

// pairedAfter is a run that took took, whose change's own write took wrote and which made n
// writes, beside its floor measured now: that write, a watch delivery and measure(n), as
// floorAfter takes it.
func pairedAfter(took, wrote time.Duration, n int, measure func(n int) time.Duration) pairedRun {
	patches, how := floorAfter(n, measure)
	return pairedRun{took: took, floor: floor{write: wrote, delivery: watchDelivery(), patches: patches, how: how}}
}

// medianOf is the median of ds and ds spelt in order, for the table.
func medianOf(ds []time.Duration) (time.Duration, string) {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	spelt := make([]string, len(sorted))
	for i, d := range sorted {
		spelt[i] = d.Round(time.Millisecond).String()
	}
	return sorted[len(sorted)/2], strings.Join(spelt, ", ")
}

// floor is the least a change's effect can take on this cluster now, in three steps measured
// in the same run: the change's own write (the harness's request, as long as it took), one
// watch delivery (the API server telling the controller of that write: watchDelivery), and as
// many writes as the controller made, with as many in flight, by this process, until this
// process's watch saw the last of them, as the controller's writes are timed (the patch floor).
type floor struct {
	write, delivery, patches time.Duration
	how                      string // how the patch floor was measured (sampled), for the table
}

func (f floor) total() time.Duration { return f.write + f.delivery + f.patches }

// ratio is took over the floor.
func (f floor) ratio(took time.Duration) float64 {
	return took.Seconds() / max(f.total().Seconds(), 1e-3)
}

func (f floor) String() string {
	return fmt.Sprintf("%s: the change's write %s + a watch delivery %.1f ms + the same writes by this process %s%s",
		f.total().Round(time.Millisecond), f.write.Round(time.Millisecond), f.delivery.Seconds()*1000,
		f.patches.Round(time.Millisecond), f.how)
}

// ratioCheck bounds the median of runs' ratios to their floors by ratioBound, with the median
// run's figures and every run's ratio beside it.
func (c *checks) ratioCheck(what string, runs []pairedRun, detail string) {
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b pairedRun) int { return cmp.Compare(a.ratio(), b.ratio()) })
	mid := sorted[len(sorted)/2]
	spelt := make([]string, len(sorted))
	for i, r := range sorted {
		spelt[i] = fmt.Sprintf("%.2f× (%s over %s)", r.ratio(), r.took.Round(time.Millisecond), r.floor.total().Round(time.Millisecond))
	}
	c.bound(what+": time over its floor", mid.ratio() <= ratioBound,
		fmt.Sprintf("the median of %d runs <= %.1f× the floor measured right after each", len(runs), ratioBound),
		"%.2f×: the median run took %s (%s) over its floor of %s; the runs %s",
		mid.ratio(), mid.took.Round(time.Millisecond), detail, mid.floor, strings.Join(spelt, ", "))
}

// watchDelivery is the median, over five writes, of the time from a write's response to a
// watcher's sight of it: this process patches an annotation of a ConfigMap of its own and
// waits for the change on its own watch of it, as a controller's informer would see it.
func watchDelivery() time.Duration {
	cs, err := kubernetes.NewForConfig(fastCfg)
	Expect(err).NotTo(HaveOccurred())
	const ns, name = "default", "scale-watch-delivery"
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := k8s.Create(ctx, cm); err != nil {
		Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	}
	var samples []time.Duration
	for i := range 5 {
		w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		Expect(err).NotTo(HaveOccurred())
		value := fmt.Sprintf("%d-%d", time.Now().UnixNano(), i)
		patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"scale.virt-rules.io/delivery":%q}}}`, value))
		Expect(k8s.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
		written := time.Now()
		deadline := time.After(30 * time.Second)
	seen:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				Expect(ok).To(BeTrue(), "the watch of %s/%s ended", ns, name)
				if m, ok := ev.Object.(*corev1.ConfigMap); ok && ev.Type == watch.Modified && m.Annotations["scale.virt-rules.io/delivery"] == value {
					samples = append(samples, time.Since(written))
					break seen
				}
			case <-deadline:
				Fail("no watch event of " + ns + "/" + name + " within 30 s")
			}
		}
		w.Stop()
	}
	slices.Sort(samples)
	return samples[len(samples)/2]
}

// settle waits until the cluster's own writes have settled (settled), and says how long it
// waited. A change timed while KubeVirt still works through the VMIs created before it (their
// launcher pods, status updates and events) competes with that work for the API server: the
// change and each of its floor's runs are measured settled.
func settle(what string) {
	if waited, ok := settled(); ok {
		measured(what+": settled", "the cluster's writes settled %s before the change", waited.Round(time.Millisecond))
	} else {
		measured(what+": settled", "the cluster still wrote after 3 minutes: timed unsettled")
	}
}

// settled waits until fewer than 5 writes (POST, PUT, PATCH, DELETE of anything but Leases)
// happen in 2 s as kube-apiserver counts them, at most 3 minutes; false if they never do.
func settled() (time.Duration, bool) {
	writes := func() float64 {
		total := 0.0
		for kind, n := range requestsByKind(scrapeAPIServer()) {
			verb, resource, _ := strings.Cut(kind, " ")
			if resource != "leases" && slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE"}, verb) {
				total += n
			}
		}
		return total
	}
	start := time.Now()
	last := writes()
	for time.Since(start) < 3*time.Minute {
		time.Sleep(2 * time.Second)
		now := writes()
		if now-last < 5 {
			return time.Since(start), true
		}
		last = now
	}
	return time.Since(start), false
}
