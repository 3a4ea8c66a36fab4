package scale_test

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

var (
	nodeResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	vmiResource  = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
)

// tracker follows one kind through a metadata informer (a watch: it costs the API server one
// list, then events) and keeps, per object, the value virt-rules writes (a label, or
// annotations), when it last changed, and how many times it changed since mark: the writes.
// What is right (want) is set by the spec, computed with the reference implementations.
type tracker struct {
	value func(*metav1.PartialObjectMetadata) string

	mu        sync.Mutex
	objs      map[string]*metav1.PartialObjectMetadata
	have      map[string]string
	changedAt map[string]time.Time
	writes    map[string]int // value changes per object since mark
	// others counts, since mark, the updates that changed an object's labels or annotations
	// but not the value virt-rules writes: someone else's metadata writes, each of which
	// passes the controllers' label and annotation predicates and so is reconciled.
	others int
	want   map[string]string
	// floorAt is when each object was last seen with a new floor mark (floorMark): a floor's
	// writes are timed, as the controller's are, until this watch sees the last of them.
	floorAt map[string]time.Time
}

// floorMark is the label or annotation the floors write (nodePatchFloor, vmiPatchFloor), each
// run with a value of its own.
const floorMark = "scale.virt-rules.io/floor"

func floorOf(m *metav1.PartialObjectMetadata) string {
	if v, ok := m.Labels[floorMark]; ok {
		return v
	}
	return m.Annotations[floorMark]
}

// startTracker follows resource until the suite ends; value is what virt-rules writes.
func startTracker(resource schema.GroupVersionResource, value func(*metav1.PartialObjectMetadata) string) *tracker {
	GinkgoHelper()
	t := &tracker{value: value, objs: map[string]*metav1.PartialObjectMetadata{}, have: map[string]string{},
		changedAt: map[string]time.Time{}, writes: map[string]int{}, floorAt: map[string]time.Time{}}
	mc, err := metadata.NewForConfig(fastCfg)
	Expect(err).NotTo(HaveOccurred())
	informer := metadatainformer.NewFilteredMetadataInformer(mc, resource, metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.observe(nil, obj) },
		UpdateFunc: func(old, obj any) { t.observe(old, obj) },
		DeleteFunc: t.forget,
	})
	Expect(err).NotTo(HaveOccurred())
	stop := make(chan struct{})
	DeferCleanup(func() { close(stop) })
	go informer.Run(stop)
	Eventually(informer.HasSynced).WithTimeout(time.Minute).Should(BeTrue())
	return t
}

// observe records an add (old nil) or an update.
func (t *tracker) observe(old, obj any) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	key, v, now := keyOf(m), t.value(m), time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.objs[key] = m
	if o, ok := old.(*metav1.PartialObjectMetadata); ok && floorOf(o) != floorOf(m) {
		t.floorAt[key] = now
	}
	if have, seen := t.have[key]; !seen || have != v {
		t.have[key], t.changedAt[key] = v, now
		if old != nil {
			t.writes[key]++
		}
		return
	}
	if o, ok := old.(*metav1.PartialObjectMetadata); ok &&
		(!maps.Equal(o.Labels, m.Labels) || !maps.Equal(o.Annotations, m.Annotations)) {
		t.others++
	}
}

func (t *tracker) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	key := keyOf(m)
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.objs, key)
	delete(t.have, key)
	delete(t.changedAt, key)
	delete(t.floorAt, key)
}

// floorSeen waits (up to a minute) until the watch saw each of keys with the floor mark value,
// and returns when it saw the last of them.
func (t *tracker) floorSeen(keys []string, value string) time.Time {
	GinkgoHelper()
	var last time.Time
	Eventually(func() error {
		t.mu.Lock()
		defer t.mu.Unlock()
		last = time.Time{}
		for _, key := range keys {
			m, ok := t.objs[key]
			if !ok || floorOf(m) != value {
				return fmt.Errorf("%s: floor mark %q not seen yet", key, value)
			}
			if at := t.floorAt[key]; at.After(last) {
				last = at
			}
		}
		return nil
	}).WithTimeout(time.Minute).WithPolling(5 * time.Millisecond).Should(Succeed())
	return last
}

func keyOf(m *metav1.PartialObjectMetadata) string {
	if m.Namespace == "" {
		return m.Name
	}
	return m.Namespace + "/" + m.Name
}

// snapshot is every object seen, as last seen.
func (t *tracker) snapshot() []*metav1.PartialObjectMetadata {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Values(t.objs))
}

// len is how many objects the tracker holds.
func (t *tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.objs)
}

// mark starts counting writes afresh and returns the time it did.
func (t *tracker) mark() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.writes)
	t.others = 0
	return time.Now()
}

// expect sets what is right: want[key] for each key.
func (t *tracker) expect(want map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.want = want
}

// wrong is how many objects of want do not have their value, and one of them.
func (t *tracker) wrong() (int, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, example := 0, ""
	for key, want := range t.want {
		if have, ok := t.have[key]; !ok || have != want {
			if n == 0 {
				example = fmt.Sprintf("%s: have %q, want %q", key, have, want)
			}
			n++
		}
	}
	return n, example
}

// rightAfter waits (up to timeout) until every object of want has its value, and returns how
// long after start the last of them got it, as the watch saw it.
func (t *tracker) rightAfter(start time.Time, timeout time.Duration) time.Duration {
	GinkgoHelper()
	right, wrong := t.rightWithin(start, timeout)
	if wrong > 0 {
		n, example := t.wrong()
		Fail(fmt.Sprintf("%d wrong after %s, e.g. %s", n, timeout, example))
	}
	return right
}

// rightWithin waits (up to timeout) until every object of want has its value. It returns how
// long after start the last of them got it, as the watch saw it, and how many are still wrong
// at the timeout (then the duration is the timeout).
func (t *tracker) rightWithin(start time.Time, timeout time.Duration) (time.Duration, int) {
	GinkgoHelper()
	lastReport, deadline := time.Now(), time.Now().Add(timeout)
	for {
		if msg := controllerDead(); msg != "" {
			Fail(msg)
		}
		n, example := t.wrong()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return timeout, n
		}
		if time.Since(lastReport) > 30*time.Second {
			progress("waiting: %d wrong, e.g. %s", n, example)
			lastReport = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	last := start
	for key := range t.want {
		if at := t.changedAt[key]; at.After(last) {
			last = at
		}
	}
	return last.Sub(start), 0
}

// written is the writes since mark: how many, to how many objects, and the most any one got.
func (t *tracker) written() (writes, objects, most int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.writes {
		writes += n
		objects++
		most = max(most, n)
	}
	return writes, objects, most
}

// othersWritten is how many updates since mark changed labels or annotations other than the
// value virt-rules writes.
func (t *tracker) othersWritten() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.others
}

// changedKeys counts the keys whose value in after differs from before; a key new in after
// was "-" (no label, no annotation).
func changedKeys(before, after map[string]string) int {
	n := 0
	for key, v := range after {
		old, ok := before[key]
		if !ok {
			old = "-"
		}
		if old != v {
			n++
		}
	}
	return n
}

// firstWrite is how long after start the first write since mark was seen (0 without one): with
// the time until every value is right, it says whether a change's time went in reacting or in
// writing.
func (t *tracker) firstWrite(start time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var first time.Time
	for key, n := range t.writes {
		if at := t.changedAt[key]; n > 0 && at.After(start) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	if first.IsZero() {
		return 0
	}
	return first.Sub(start)
}
