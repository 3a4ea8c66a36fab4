package pool

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The pool metrics (design 003), labelled with the pool as "<namespace>/<name>".
var (
	vmStarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "virtrules_pool_vm_starts_total",
		Help: "VMs of the pool seen reaching the Running phase.",
	}, []string{"pool"})
	vmStops = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "virtrules_pool_vm_stops_total",
		Help: "VMs of the pool seen stopping: their running VMI ended or went away.",
	}, []string{"pool"})
	phaseTransitions = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "virtrules_pool_vmi_phase_transition_seconds",
		Help:    "Time a VMI of the pool took to reach a phase from the previous one (KubeVirt's phaseTransitionTimestamps).",
		Buckets: []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600},
	}, []string{"pool", "phase"})
	createsPerPass = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "virtrules_pool_creates_per_pass",
		Help:    "VMs created by one pass of the pool controller (at most the burst limit).",
		Buckets: []float64{1, 10, 50, 100, 250, 500, 1000},
	}, []string{"pool"})
	plansDeferred = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "virtrules_pool_plans_deferred_total",
		Help: "Updates of the pool's VMs and VMIs whose plan waited for the end of the pool's plan interval (--pool-plan-interval), merged there with the updates that followed.",
	}, []string{"pool"})
)

func init() {
	metrics.Registry.MustRegister(vmStarts, vmStops, phaseTransitions, createsPerPass, plansDeferred)
}

// vmiObserver turns the VMIs each reconcile sees into the start, stop and phase-transition
// metrics, counting each VMI's events once.
type vmiObserver struct {
	mu    sync.Mutex
	pools map[string]map[types.UID]*vmiState
}

type vmiState struct {
	running     bool
	transitions int // phaseTransitionTimestamps already observed
}

// count records a start when the VMI reaches Running and a stop when it leaves it for good.
func (st *vmiState) count(pool, phase string) {
	switch {
	case phase == "Running" && !st.running:
		st.running = true
		vmStarts.WithLabelValues(pool).Inc()
	case (phase == "Succeeded" || phase == "Failed") && st.running:
		st.running = false
		vmStops.WithLabelValues(pool).Inc()
	}
}

func (o *vmiObserver) init() { o.pools = map[string]map[types.UID]*vmiState{} }

func (o *vmiObserver) forget(pool string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.pools, pool)
}

func (o *vmiObserver) observe(pool string, vmis []*unstructured.Unstructured) {
	o.mu.Lock()
	defer o.mu.Unlock()
	states, known := o.pools[pool]
	if !known {
		states = map[types.UID]*vmiState{}
		o.pools[pool] = states
	}
	seen := make(map[types.UID]bool, len(vmis))
	for _, vmi := range vmis {
		uid := vmi.GetUID()
		seen[uid] = true
		phase, _, _ := unstructured.NestedString(vmi.Object, "status", "phase")
		stamps, _, _ := unstructured.NestedSlice(vmi.Object, "status", "phaseTransitionTimestamps")
		st, ok := states[uid]
		if !ok {
			st = &vmiState{}
			states[uid] = st
			if !known { // what ran before this controller started is not a start it saw
				st.running, st.transitions = phase == "Running", len(stamps)
				continue
			}
		}
		// KubeVirt records every phase a VMI went through in phaseTransitionTimestamps, so
		// counting from them misses nothing between two reconciles; the phase itself is the
		// fallback for a VMI without them.
		for i := st.transitions; i < len(stamps); i++ {
			cur := transition(stamps[i])
			if i > 0 {
				if prev := transition(stamps[i-1]); !prev.at.IsZero() && !cur.at.IsZero() && cur.phase != "" {
					phaseTransitions.WithLabelValues(pool, cur.phase).Observe(cur.at.Sub(prev.at).Seconds())
				}
			}
			st.count(pool, cur.phase)
		}
		if len(stamps) == 0 {
			st.count(pool, phase)
		}
		st.transitions = max(st.transitions, len(stamps))
	}
	for uid, st := range states {
		if !seen[uid] {
			if st.running {
				vmStops.WithLabelValues(pool).Inc()
			}
			delete(states, uid)
		}
	}
}

type phaseAt struct {
	phase string
	at    time.Time
}

func transition(raw any) phaseAt {
	m, _ := raw.(map[string]any)
	phase, _ := m["phase"].(string)
	ts, _ := m["phaseTransitionTimestamp"].(string)
	at, _ := time.Parse(time.RFC3339, ts)
	return phaseAt{phase: phase, at: at}
}
