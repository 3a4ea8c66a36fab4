// Package shadow runs a candidate bundle beside the active one: every decision a controller
// makes, and every answer a webhook or the defaulter gives, with the active bundle is asked of
// the candidate too, off the controller's and the webhook's path, and never acted on. A difference is counted (virtrules_candidate_decision_differences_total),
// logged as a decision-log event carrying both sides, and kept, bounded, for the reports.
// The comparison is `virt-rules diff`'s (eval.Compare): explanations aside, every field a
// controller would act on.
//
// Promotion is never automatic: an admin points the active bundle at the candidate.
package shadow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
)

// The decisions compared, as the metrics' decision label and the reports' rule: the sections
// of eval -o json.
const (
	DecisionMigrationPolicies = "migrationPolicies"
	DecisionMigrationTargets  = "migrationTargets"
	DecisionNodeMigratability = "nodeMigratability"
	DecisionPools             = "pools"
)

// The webhooks' and the defaulter's decisions (CompareAnswer), named as the Rego entrypoint
// each asks, as virtrules_decision_budget_exceeded_total names them. They are answers to one
// request, not the standing state of an object: counted, logged and sent to the decision
// log, but not kept for the reports.
const (
	// DecisionMigrationPolicyValidation: whether the MigrationPolicy webhook admits a policy.
	DecisionMigrationPolicyValidation = "migration.policy.validation"
	// DecisionMigrationState: the policy and configuration the migration state webhook writes
	// into a VMI's status.migrationState.
	DecisionMigrationState = "migration.policy"
	// DecisionMigrationValidation: whether the migration webhook admits a migration (its
	// added node selector term) and whether the migration adds a node requirement.
	DecisionMigrationValidation = "migration.target.term_errors"
	// DecisionMigrationTargetPodAffinity: the node affinity the target pod webhook writes into
	// a migration's target virt-launcher pod.
	DecisionMigrationTargetPodAffinity = "migration.target.pod_node_affinity"
	// DecisionSchedulingAffinity: the node affinity the scheduling webhook writes into a
	// host-model VMI's virt-launcher pod at its first scheduling.
	DecisionSchedulingAffinity = "node.migratability.scheduling_affinity"
	// DecisionVMDefaults: the defaults the defaulter service fills into a VM.
	DecisionVMDefaults = "vm.defaults.defaults"
)

// The results of one comparison, as the comparisons metric's result label.
const (
	ResultSame      = "same"
	ResultDifferent = "different"
	// ResultError: the candidate failed to decide (its error is logged).
	ResultError = "error"
	// ResultSkipped: MaxQueued comparisons were waiting; this decision was not compared.
	ResultSkipped = "skipped"
)

// Defaults of Options.
const (
	DefaultMaxInFlight    = 4
	DefaultMaxQueued      = 10000
	DefaultMaxDifferences = 1000
)

// Options tune New.
type Options struct {
	// Log receives the differences and the candidate's errors; nil discards.
	Log *slog.Logger
	// DecisionLog receives one event per difference (name "candidate.<decision>"); nil: none.
	DecisionLog engine.DecisionLogger
	// Registerer registers the metrics; nil: none are registered.
	Registerer prometheus.Registerer
	// MaxInFlight bounds the candidate's evaluations running at once (DefaultMaxInFlight).
	MaxInFlight int
	// MaxQueued bounds the comparisons waiting for one of them (DefaultMaxQueued); beyond,
	// a decision is not compared (counted as skipped).
	MaxQueued int
	// MaxDifferences bounds the differences kept for the reports (DefaultMaxDifferences); the
	// oldest go first.
	MaxDifferences int
}

// Difference is one decision the candidate makes differently, as last compared.
type Difference struct {
	Decision string
	// Namespace and Name are the object decided ("" namespace: cluster-scoped), Object
	// its key as eval reports it.
	Namespace, Name, Object string
	// Fields are the fields that differ, explanations aside.
	Fields []string
	// Active and Candidate are each side's result (JSON, null when a side has none) and the
	// revision that decided it.
	Active, Candidate                 json.RawMessage
	ActiveRevision, CandidateRevision string
	Time                              time.Time
}

// Shadow compares the active bundle's decisions with a candidate bundle's. Safe for
// concurrent use.
type Shadow struct {
	candidate *engine.Engine
	active    *engine.Engine
	log       *slog.Logger
	decisions engine.DecisionLogger
	workers   int
	queue     chan comparison
	pending   sync.WaitGroup
	max       int

	comparisons *prometheus.CounterVec
	differences *prometheus.CounterVec

	mu    sync.Mutex
	diffs map[string]*Difference
	order []string // keys of diffs, oldest first
	// changed receives the namespace ("" for cluster-scoped) of each difference found or
	// gone, for the reports; a full channel drops the event (the next one catches up).
	changed chan event.TypedGenericEvent[client.Object]
	// resyncs are the controllers' channels told when the candidate serves a new revision.
	resyncs []chan event.TypedGenericEvent[client.Object]
}

// New compares active's decisions with candidate's.
func New(active, candidate *engine.Engine, o Options) (*Shadow, error) {
	if active == nil || candidate == nil {
		return nil, errors.New("shadow: want an active and a candidate engine")
	}
	if o.MaxInFlight < 0 || o.MaxQueued < 0 || o.MaxDifferences < 0 {
		return nil, fmt.Errorf("shadow: max in flight %d, max queued %d, max differences %d: want 0 (the default) or more",
			o.MaxInFlight, o.MaxQueued, o.MaxDifferences)
	}
	s := &Shadow{
		candidate: candidate, active: active, log: o.Log, decisions: o.DecisionLog,
		workers: cmpOr(o.MaxInFlight, DefaultMaxInFlight), queue: make(chan comparison, cmpOr(o.MaxQueued, DefaultMaxQueued)),
		max:   cmpOr(o.MaxDifferences, DefaultMaxDifferences),
		diffs: map[string]*Difference{}, changed: make(chan event.TypedGenericEvent[client.Object], 1024),
		comparisons: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "virtrules_candidate_decision_comparisons_total",
			Help: "Decisions asked of the candidate bundle beside the active one, by decision and result (same, different, error, skipped).",
		}, []string{"decision", "result"}),
		differences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "virtrules_candidate_decision_differences_total",
			Help: "Decisions the candidate bundle makes differently from the active one, by decision.",
		}, []string{"decision"}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{s.comparisons, s.differences} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("shadow: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

func cmpOr(n, def int) int {
	if n == 0 {
		return def
	}
	return n
}

// Candidate is the candidate bundle's engine, for the controllers to ask.
func (s *Shadow) Candidate() *engine.Engine { return s.candidate }

// Object is one object a decision is about: Namespace "" for a cluster-scoped one.
type Object struct{ Namespace, Name string }

// Key is the object as eval reports it: namespace/name, or the name.
func (o Object) Key() string {
	if o.Namespace == "" {
		return o.Name
	}
	return o.Namespace + "/" + o.Name
}

// comparison is one decision waiting to be compared.
type comparison struct {
	ctx      context.Context
	decision string
	objects  []Object
	// diff asks the candidate and lists where it decides otherwise than the active bundle.
	diff func(context.Context) ([]eval.Change, error)
	// keep: the differences are kept for the reports (a controller's standing decision).
	keep bool
}

// Compare queues a comparison: the candidate is asked, in the background, what decide says,
// and its answer compared with active, what the active bundle decided: both are eval reports
// of the decision for objects. MaxInFlight comparisons run at once (Start) and MaxQueued
// wait; beyond that the decision is not compared (counted as skipped), so a slow candidate
// never holds a controller up. The candidate's evaluations run within its own decision budget
// (--decision-timeout, --decision-memory-limit), detached from the controller's context,
// which may end first.
func (s *Shadow) Compare(ctx context.Context, decision string, objects []Object, active *eval.Report,
	decide func(context.Context) (*eval.Report, error)) {
	s.enqueue(comparison{ctx: ctx, decision: decision, objects: objects, keep: true, diff: func(ctx context.Context) ([]eval.Change, error) {
		candidate, err := decide(ctx)
		if err != nil {
			return nil, err
		}
		return eval.Compare(active, candidate)
	}})
}

// CompareAnswer queues the comparison of a webhook's (or the defaulter's) answer about object:
// active is what the active bundle answered, decide asks the candidate the same question; both
// encode as JSON objects, compared field by field as Compare compares (eval.CompareAnswers).
// Call it once the webhook's answer is decided: it only queues, bounded as Compare is, so the
// webhook's latency does not grow. A difference is counted, logged and sent to the decision
// log, but not kept for the reports: it answers one request.
func (s *Shadow) CompareAnswer(ctx context.Context, decision string, object Object, active any,
	decide func(context.Context) (any, error)) {
	s.enqueue(comparison{ctx: ctx, decision: decision, objects: []Object{object}, diff: func(ctx context.Context) ([]eval.Change, error) {
		candidate, err := decide(ctx)
		if err != nil {
			return nil, err
		}
		c, err := eval.CompareAnswers(decision, object.Key(), active, candidate)
		if err != nil || c == nil {
			return nil, err
		}
		return []eval.Change{*c}, nil
	}})
}

func (s *Shadow) enqueue(c comparison) {
	c.ctx = context.WithoutCancel(c.ctx)
	s.pending.Add(1)
	select {
	case s.queue <- c:
	default:
		s.pending.Done()
		s.comparisons.WithLabelValues(c.decision, ResultSkipped).Add(float64(len(c.objects)))
	}
}

// NeedLeaderElection is false: every replica serves webhooks, and compares the answers it
// gives. The controllers decide, and so queue comparisons, on the leader only.
func (s *Shadow) NeedLeaderElection() bool { return false }

// Start runs the comparisons until ctx ends: a manager Runnable on every replica (see
// NeedLeaderElection), or a goroutine of the defaulter.
func (s *Shadow) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range s.workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case c := <-s.queue:
					s.compare(c)
					s.pending.Done()
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// Wait waits until every queued comparison is done, for tests; Start must be running.
func (s *Shadow) Wait() { s.pending.Wait() }

func (s *Shadow) compare(c comparison) {
	activeRevision := s.active.Revision()
	changes, err := c.diff(c.ctx)
	if err != nil {
		s.comparisons.WithLabelValues(c.decision, ResultError).Add(float64(len(c.objects)))
		s.log.WarnContext(c.ctx, "candidate bundle failed to decide", "decision", c.decision, "objects", len(c.objects),
			"candidateRevision", s.candidate.Revision(), "error", err)
		return
	}
	byObject := map[string][]eval.Change{}
	for _, ch := range changes {
		byObject[ch.Object] = append(byObject[ch.Object], ch)
	}
	for _, o := range c.objects {
		s.record(c.ctx, c.decision, o, activeRevision, byObject[o.Key()], c.keep)
	}
}

// record counts one comparison of the decision for object and, with keep, keeps its changes,
// forgetting an earlier difference of the same object when there are none.
func (s *Shadow) record(ctx context.Context, decision string, o Object, activeRevision string, changes []eval.Change, keep bool) {
	candidateRevision := s.candidate.Revision()
	namespace, object := o.Namespace, o.Key()
	key := decision + "\x00" + object
	if len(changes) == 0 {
		s.comparisons.WithLabelValues(decision, ResultSame).Inc()
		if keep && s.forget(key) {
			s.notify(namespace)
		}
		return
	}
	s.comparisons.WithLabelValues(decision, ResultDifferent).Inc()
	s.differences.WithLabelValues(decision).Inc()
	var fields []string
	for _, c := range changes {
		fields = append(fields, c.Fields...)
	}
	slices.Sort(fields)
	d := &Difference{
		Decision: decision, Namespace: namespace, Name: o.Name, Object: object, Fields: slices.Compact(fields),
		Active: changes[0].Base, Candidate: changes[0].New, ActiveRevision: activeRevision, CandidateRevision: candidateRevision,
		Time: time.Now(),
	}
	s.log.InfoContext(ctx, "candidate bundle decides differently", "decision", decision, "object", object,
		"fields", d.Fields, "activeRevision", activeRevision, "candidateRevision", candidateRevision,
		"active", string(d.Active), "candidate", string(d.Candidate))
	s.logDecision(ctx, d)
	if keep && s.keep(key, d) {
		s.notify(namespace)
	}
}

// keep stores d under key and tells whether it is news (not the same fields and sides as
// the difference kept before).
func (s *Shadow) keep(key string, d *Difference) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.diffs[key]
	s.diffs[key] = d
	if ok {
		s.order = slices.DeleteFunc(s.order, func(k string) bool { return k == key })
	}
	s.order = append(s.order, key)
	for len(s.order) > s.max {
		delete(s.diffs, s.order[0])
		s.order = s.order[1:]
	}
	return !ok || !slices.Equal(old.Fields, d.Fields) || string(old.Active) != string(d.Active) ||
		string(old.Candidate) != string(d.Candidate) || old.CandidateRevision != d.CandidateRevision
}

func (s *Shadow) forget(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.diffs[key]; !ok {
		return false
	}
	delete(s.diffs, key)
	s.order = slices.DeleteFunc(s.order, func(k string) bool { return k == key })
	return true
}

func (s *Shadow) notify(namespace string) {
	o := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "candidate"}}
	select {
	case s.changed <- event.TypedGenericEvent[client.Object]{Object: o}:
	default:
	}
}

// Changes receives the namespace ("" for cluster-scoped objects) of every difference found,
// changed or gone, as a generic event of an object in it: a source for the reports controller.
func (s *Shadow) Changes() <-chan event.TypedGenericEvent[client.Object] { return s.changed }

// Resyncs is a new channel that receives an event each time Resync is called: a source for
// a controller to decide every object again, so that decisions made before the candidate's
// current revision was active are compared too. Call it before the manager starts.
func (s *Shadow) Resyncs() <-chan event.TypedGenericEvent[client.Object] {
	ch := make(chan event.TypedGenericEvent[client.Object], 1)
	s.mu.Lock()
	s.resyncs = append(s.resyncs, ch)
	s.mu.Unlock()
	return ch
}

// Resync tells every Resyncs channel that the candidate serves a new revision; one event
// already waiting stands for this one too.
func (s *Shadow) Resync() {
	o := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "candidate"}}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.resyncs {
		select {
		case ch <- event.TypedGenericEvent[client.Object]{Object: o}:
		default:
		}
	}
}

// Differences are the differences kept for objects in namespace ("" for cluster-scoped
// ones) whose candidate revision is the candidate's current one, sorted by decision and
// object.
func (s *Shadow) Differences(namespace string) []Difference {
	revision := s.candidate.Revision()
	s.mu.Lock()
	var out []Difference
	for _, d := range s.diffs {
		if d.Namespace == namespace && d.CandidateRevision == revision {
			out = append(out, *d)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Difference) int {
		if c := strings.Compare(a.Decision, b.Decision); c != 0 {
			return c
		}
		return strings.Compare(a.Object, b.Object)
	})
	return out
}

// logDecision writes d as a decision-log event: the result holds both sides.
func (s *Shadow) logDecision(ctx context.Context, d *Difference) {
	if s.decisions == nil {
		return
	}
	side := func(revision string, result json.RawMessage) map[string]any {
		var v any
		_ = json.Unmarshal(result, &v) // eval.Compare encoded it
		return map[string]any{"revision": revision, "result": v}
	}
	result, err := ast.InterfaceToValue(map[string]any{
		"object": d.Object, "fields": d.Fields,
		"active": side(d.ActiveRevision, d.Active), "candidate": side(d.CandidateRevision, d.Candidate),
	})
	if err != nil {
		s.log.ErrorContext(ctx, "encode candidate difference for the decision log", "object", d.Object, "error", err)
		return
	}
	input, _ := ast.InterfaceToValue(map[string]any{"decision": d.Decision, "object": d.Object})
	s.decisions.LogDecision(ctx, &engine.Decision{
		Name: "candidate." + d.Decision, Revision: d.ActiveRevision, Input: input, Result: ast.NewTerm(result), Timestamp: d.Time,
	})
}
