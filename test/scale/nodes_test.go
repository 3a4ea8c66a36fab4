package scale_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/test/reference"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// generation is a CPU generation as virt-handler's node labeller reports it: a newer one runs
// the older ones' models and has their features, plus its own; its host model requires its
// newest feature, so host-model VMs started on it can go only to nodes that have it.
type generation struct {
	cpu testcluster.CPU
	// features are cpu-feature.node.kubevirt.io/ labels; required the host model's
	// host-model-required-features.node.kubevirt.io/ labels.
	features, required []string
	// share is how many nodes of every shareSlots are of this generation.
	share int
}

var generations = func() []generation {
	type gen struct {
		model, feature string
		share          int
	}
	var (
		out              []generation
		models, features []string
	)
	for _, g := range []gen{
		{"Haswell-noTSX-IBRS", "avx2", 3},
		{"Broadwell-noTSX-IBRS", "adx", 5},
		{"Skylake-Client-IBRS", "clflushopt", 6},
		{"Cascadelake-Server", "avx512vnni", 5},
		{"Icelake-Server", "avx512vbmi2", 4},
	} {
		models = append([]string{g.model}, models...)
		features = append(features, g.feature)
		out = append(out, generation{
			cpu:      testcluster.CPU{Vendor: "Intel", HostModel: g.model, Models: append([]string(nil), models...)},
			features: append([]string(nil), features...),
			required: []string{g.feature},
			share:    g.share,
		})
	}
	return out
}()

// shareSlots is what the generations' shares add up to. Not a divisor of 100: with shares of
// 20, every level of a 5,000-node cluster sat exactly on a whole percent, and one node of the
// newest generation joining moved 4,251 levels; a cluster's shares are no such round numbers.
// Here (654, 1,090, 1,303, 1,085 and 868 nodes of 5,000) one node joining moves no level but its
// own, as most joins do; the harness then finds a join that moves many (joinsUntilLevelsMove).
const shareSlots = 23

// newestSlot is a node index of the newest generation.
const newestSlot = shareSlots - 1

// generationOf spreads the generations over node indexes by their shares.
func generationOf(i int) generation {
	slot := i % shareSlots
	for _, g := range generations {
		if slot < g.share {
			return g
		}
		slot -= g.share
	}
	panic("generation shares must add up to shareSlots")
}

// scaleNode is node i (or the one named): its generation's labels, in one of four zones.
func scaleNode(name string, g generation, zone int) *corev1.Node {
	labels := map[string]string{"topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", zone)}
	for _, f := range g.features {
		labels[reference.CPUFeatureLabelPrefix+f] = "true"
	}
	for _, f := range g.required {
		labels[reference.HostModelRequiredFeaturesPrefix+f] = "true"
	}
	return testcluster.Node(name, g.cpu, labels)
}

// createNodes creates the nodes with workers requests in flight: each node, then its capacity
// (as testcluster.CreateNodes does, without waiting for each to be Ready).
func createNodes(list []*corev1.Node) {
	GinkgoHelper()
	Expect(parallel(len(list), func(i int) error {
		n := list[i].DeepCopy()
		status := n.Status
		if err := k8s.Create(ctx, n); err != nil {
			return fmt.Errorf("create node %s: %w", n.Name, err)
		}
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": status.Capacity, "allocatable": status.Allocatable}})
		if err != nil {
			return err
		}
		if err := k8s.Status().Patch(ctx, n, client.RawPatch("application/merge-patch+json", patch)); err != nil {
			return fmt.Errorf("write capacity of node %s: %w", n.Name, err)
		}
		return nil
	})).To(Succeed())
}

// parallel runs do(0..n-1) on workers goroutines and returns the first error.
func parallel(n int, do func(i int) error) error { return parallelOn(workers, n, do) }

// parallelOn runs do(0..n-1) on w goroutines and returns the first error.
func parallelOn(w, n int, do func(i int) error) error {
	var (
		next     atomic.Int64
		firstErr error
		once     sync.Once
		wg       sync.WaitGroup
	)
	for range min(w, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := do(i); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(n)) // stop handing out work
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// nodeLevel is what the node labeller writes: the level label, "-" when absent.
func nodeLevel(m *metav1.PartialObjectMetadata) string {
	if v, ok := m.Labels[nodelabeller.LabelLevel]; ok {
		return v
	}
	return "-"
}

// expectLevels sets what every node's level label must be, by the reference implementation,
// from the nodes as the tracker last saw them (no node here is cordoned: spec.unschedulable,
// which a metadata watch does not carry, is false for all).
func expectLevels() map[string]string {
	objs := nodes.snapshot()
	ref := make([]reference.Node, 0, len(objs))
	for _, m := range objs {
		ref = append(ref, reference.Node{Name: m.Name, Labels: m.Labels})
	}
	levels := reference.MigratabilityGrouped(ref)
	want := make(map[string]string, len(objs))
	for _, m := range objs {
		want[m.Name] = "-"
		if l, ok := levels[m.Name]; ok {
			want[m.Name] = strconv.Itoa(l)
		}
	}
	nodes.expect(want)
	return want
}

// joinsUntilLevelsMove is how many nodes of generation g must join the nodes there are now, one
// after the other, until one moves the level of nodes other than itself (by the reference
// implementation), and how many levels that join moves; 0 when none of the first limit does.
func joinsUntilLevelsMove(g generation, limit int) (joins, moved int) {
	objs := nodes.snapshot()
	ref := make([]reference.Node, 0, len(objs)+limit)
	for _, m := range objs {
		ref = append(ref, reference.Node{Name: m.Name, Labels: m.Labels})
	}
	before := reference.MigratabilityGrouped(ref)
	for j := 1; j <= limit; j++ {
		n := scaleNode(fmt.Sprintf("node-probe-%d", j), g, 0)
		ref = append(ref, reference.Node{Name: n.Name, Labels: n.Labels})
		after := reference.MigratabilityGrouped(ref)
		for name, l := range before {
			if after[name] != l {
				moved++
			}
		}
		if moved > 0 {
			return j, moved
		}
		before = after
	}
	return 0, 0
}

// waitForNodes waits until the tracker holds n nodes.
func waitForNodes(n int) {
	GinkgoHelper()
	Eventually(nodes.len).WithTimeout(5 * time.Minute).Should(Equal(n))
}

// readyNodes counts the nodes that are Ready and rid of the not-ready taint.
func readyNodes() int {
	var list corev1.NodeList
	Expect(k8s.List(ctx, &list, client.UnsafeDisableDeepCopy)).To(Succeed())
	n := 0
	for i := range list.Items {
		if nodeReady(&list.Items[i]) {
			n++
		}
	}
	return n
}

func nodeReady(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady {
			return false
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodePatchFloor merge-patches a label of this test's own onto n nodes, inFlight at a time, and
// returns how long that took: what the API server needs for as many node writes as a change
// made the controller write, timed, as the controller's are, until the harness's watch of nodes
// saw the last of them.
func nodePatchFloor(n, inFlight int) time.Duration {
	GinkgoHelper()
	floorRuns++
	value := strconv.Itoa(floorRuns)
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, floorMark, value))
	list := nodes.snapshot() // the nodes there are now: one may have left
	keys := make([]string, 0, min(n, len(list)))
	for i := range min(n, len(list)) {
		keys = append(keys, keyOf(list[i]))
	}
	start := time.Now()
	Expect(parallelOn(inFlight, n, func(i int) error {
		node := &corev1.Node{}
		node.Name = list[i%len(list)].Name
		return k8s.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch))
	})).To(Succeed())
	return nodes.floorSeen(keys, value).Sub(start)
}

// floorRuns numbers the floor measurements, so each changes its label.
var floorRuns int
