// Package bundlestatus makes the engine's bundle activations and refusals visible to an
// operator: Prometheus metrics, a Kubernetes Event on each swap, and readiness.
//
// Metrics (all under virtrules_bundle_):
//
//	virtrules_bundle_active_revision{revision,source}            1 for the bundle serving
//	virtrules_bundle_load_successes_total                        bundles activated (and restored)
//	virtrules_bundle_load_failures_total{reason}                 bundles refused, by engine.Reason*
//	virtrules_bundle_last_activation_timestamp_seconds           when the serving bundle was activated
//	virtrules_bundle_seconds_since_last_activation               -1 before the first activation
//
// and, for the decisions the bundle makes:
//
//	virtrules_decision_budget_exceeded_total{decision,budget}    live evaluations stopped for
//	                                                             their time or memory budget
//
// NewCandidate exports a shadow rollout's candidate bundle (internal/shadow) the same way,
// under sibling names, so that an alert on the active bundle never fires for the candidate:
// virtrules_candidate_bundle_active_revision, virtrules_candidate_bundle_load_successes_total,
// virtrules_candidate_bundle_load_failures_total{reason},
// virtrules_candidate_bundle_last_activation_timestamp_seconds,
// virtrules_candidate_bundle_seconds_since_last_activation and
// virtrules_candidate_decision_budget_exceeded_total{decision,budget}; its Events have the
// reasons CandidateBundleActivated and CandidateBundleRefused, and a refusal repeating the
// last one (a server serving the same bad bundle at every poll) is recorded at most once per
// CandidateEventInterval, while every refusal is counted.
package bundlestatus

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/virt-rules/virt-rules/engine"
)

// Event reasons.
const (
	ReasonActivated = "BundleActivated"
	ReasonRefused   = "BundleRefused"
	// The candidate bundle's (NewCandidate).
	ReasonCandidateActivated = "CandidateBundleActivated"
	ReasonCandidateRefused   = "CandidateBundleRefused"
)

// CandidateEventInterval is how often, at most, the candidate's Status records the same
// refusal again as an Event.
const CandidateEventInterval = 10 * time.Minute

// names are what a Status exports under: the active bundle's or the candidate's.
type names struct {
	prefix, budget     string // metric name prefixes
	activated, refused string // Event reasons
	subject            string // "Bundle" or "Candidate bundle", starting Event messages
	keeps              string // what the previous revision does after a refusal
	repeatEventsAfter  time.Duration
}

var (
	activeNames = names{prefix: "virtrules_bundle_", budget: "virtrules_decision_", activated: ReasonActivated,
		refused: ReasonRefused, subject: "Bundle", keeps: "keeps serving"}
	candidateNames = names{prefix: "virtrules_candidate_bundle_", budget: "virtrules_candidate_decision_",
		activated: ReasonCandidateActivated, refused: ReasonCandidateRefused, subject: "Candidate bundle",
		keeps:             "stays the candidate compared",
		repeatEventsAfter: CandidateEventInterval}
)

// Status observes engine bundle events. Safe for concurrent use.
type Status struct {
	activeRevision *prometheus.GaugeVec
	successes      prometheus.Counter
	failures       *prometheus.CounterVec
	lastActivation prometheus.Gauge
	overBudget     *prometheus.CounterVec

	names names

	mu   sync.Mutex
	last time.Time // of the last activation
	// lastRefusal and lastRefusalEvent are the message and time of the last refusal
	// recorded as an Event, for names.repeatEventsAfter.
	lastRefusal      string
	lastRefusalEvent time.Time
	pending          []engine.BundleEvent // the last events before they could be recorded (maxPending)
	recorder         record.EventRecorder
	object           runtime.Object
}

// New registers the bundle metrics on reg.
func New(reg prometheus.Registerer) (*Status, error) { return newStatus(reg, activeNames) }

// NewCandidate registers the candidate bundle's metrics on reg: the same as New's, named
// virtrules_candidate_bundle_* and virtrules_candidate_decision_budget_exceeded_total.
func NewCandidate(reg prometheus.Registerer) (*Status, error) { return newStatus(reg, candidateNames) }

func newStatus(reg prometheus.Registerer, n names) (*Status, error) {
	s := &Status{
		names: n,
		activeRevision: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: n.prefix + "active_revision",
			Help: "1 for the revision of the Rego bundle serving decisions, labelled with where it came from.",
		}, []string{"revision", "source"}),
		successes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: n.prefix + "load_successes_total",
			Help: "Rego bundles activated.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: n.prefix + "load_failures_total",
			Help: "Rego bundles not activated (the previous one kept serving), or refused while serving and replaced by the one before (budget), by reason: download, signature, read, compile, decisions, settings, test, trial, budget, prepare, persist.",
		}, []string{"reason"}),
		overBudget: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: n.budget + "budget_exceeded_total",
			Help: "Evaluations of a decision stopped for breaking their budget (time or memory), by decision (the Rego entrypoint, such as migration.policy) and budget.",
		}, []string{"decision", "budget"}),
		lastActivation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: n.prefix + "last_activation_timestamp_seconds",
			Help: "Unix time of the last successful bundle activation.",
		}),
	}
	sinceLast := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: n.prefix + "seconds_since_last_activation",
		Help: "Seconds since the last successful bundle activation; -1 before the first.",
	}, s.secondsSinceLast)
	for _, c := range []prometheus.Collector{s.activeRevision, s.successes, s.failures, s.lastActivation, sinceLast, s.overBudget} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Status) secondsSinceLast() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last.IsZero() {
		return -1
	}
	return time.Since(s.last).Seconds()
}

// maxPending bounds the events kept until RecordEventsOn: the last ones.
const maxPending = 8

// RecordEventsOn records a Kubernetes Event on object (the controller's Pod) for each later
// activation and refusal, and now for the last ones before it was called (the bundle
// activated at start, a candidate refused at start).
func (s *Status) RecordEventsOn(recorder record.EventRecorder, object runtime.Object) {
	s.mu.Lock()
	s.recorder, s.object = recorder, object
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, ev := range pending {
		s.event(ev)
	}
}

// keepPending keeps ev for RecordEventsOn when no recorder is set yet, and tells whether it did.
func (s *Status) keepPending(ev engine.BundleEvent) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recorder != nil {
		return false
	}
	s.pending = append(s.pending, ev)
	if len(s.pending) > maxPending {
		s.pending = s.pending[len(s.pending)-maxPending:]
	}
	return true
}

// Observe is an engine.WithBundleEvents hook.
func (s *Status) Observe(_ context.Context, ev engine.BundleEvent) {
	if ev.Err != nil {
		s.failures.WithLabelValues(ev.Reason).Inc()
		if !s.keepPending(ev) {
			s.event(ev)
		}
		return
	}
	s.successes.Inc()
	s.activeRevision.Reset()
	s.activeRevision.WithLabelValues(ev.Revision, ev.Source).Set(1)
	s.lastActivation.Set(float64(ev.Time.UnixNano()) / 1e9)
	s.mu.Lock()
	s.last = ev.Time
	s.mu.Unlock()
	if !s.keepPending(ev) {
		s.event(ev)
	}
}

// ObserveBudget is an engine.WithBudgetEvents hook. The decision label takes the engine's
// entrypoint names, a fixed set; the budget label engine.BudgetTime or engine.BudgetMemory.
func (s *Status) ObserveBudget(_ context.Context, err *engine.BudgetError) {
	s.overBudget.WithLabelValues(err.Decision, err.Budget).Inc()
}

func (s *Status) event(ev engine.BundleEvent) {
	s.mu.Lock()
	recorder, object := s.recorder, s.object
	s.mu.Unlock()
	if recorder == nil {
		return
	}
	n := s.names
	if ev.Err != nil {
		serving := ev.PreviousRevision
		if serving == "" {
			serving = "(none)"
		}
		verb := "refused"
		if ev.Reason == engine.ReasonDownload {
			verb = "not downloaded"
		}
		msg := fmt.Sprintf("%s from %s %s (%s), revision %s %s: %v", n.subject, ev.Source, verb, ev.Reason, serving, n.keeps, ev.Err)
		if ev.RefusedRevision != "" {
			msg = fmt.Sprintf("%s revision %s from %s refused while serving (%s): %v", n.subject, ev.RefusedRevision, ev.Source, ev.Reason, ev.Err)
		}
		if len(msg) > maxMessage {
			msg = msg[:maxMessage-3] + "..."
		}
		if s.repeated(msg, ev.Time) {
			return
		}
		recorder.Event(object, corev1.EventTypeWarning, n.refused, msg)
		return
	}
	s.mu.Lock()
	s.lastRefusal = "" // a refusal after an activation is news
	s.mu.Unlock()
	if ev.Restored {
		recorder.Eventf(object, corev1.EventTypeNormal, n.activated,
			"%s revision %s from %s restored, replacing revision %s, refused for breaking its decision budget", n.subject, ev.Revision, ev.Source, ev.PreviousRevision)
		return
	}
	if ev.PreviousRevision == "" {
		recorder.Eventf(object, corev1.EventTypeNormal, n.activated, "%s revision %s from %s activated", n.subject, ev.Revision, ev.Source)
		return
	}
	recorder.Eventf(object, corev1.EventTypeNormal, n.activated,
		"%s revision %s from %s activated, replacing revision %s", n.subject, ev.Revision, ev.Source, ev.PreviousRevision)
}

// repeated tells whether msg is the last refusal recorded as an Event, less than
// names.repeatEventsAfter before now; if not, msg becomes the last one.
func (s *Status) repeated(msg string, now time.Time) bool {
	if s.names.repeatEventsAfter == 0 {
		return false
	}
	if now.IsZero() {
		now = time.Now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if msg == s.lastRefusal && now.Sub(s.lastRefusalEvent) < s.names.repeatEventsAfter {
		return true
	}
	s.lastRefusal, s.lastRefusalEvent = msg, now
	return false
}

// maxMessage keeps an Event's message (a refusal can list many compile errors) within what
// the API server stores.
const maxMessage = 1024

// PodFromEnv is the controller's own Pod, named by the POD_NAME and POD_NAMESPACE
// environment variables (the downward API in examples/deploy), to record Events on; nil
// when they are not set.
func PodFromEnv() runtime.Object {
	name, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || ns == "" {
		return nil
	}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(os.Getenv("POD_UID"))},
	}
}
