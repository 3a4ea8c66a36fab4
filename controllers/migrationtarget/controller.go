// Package migrationtarget applies the migration target decision (design 001) in a cluster:
//
//   - the controller fails at once a VirtualMachineInstanceMigration whose added constraint
//     leaves no node to migrate to (phase Failed, a condition carrying the reason code, an
//     Event), and records the candidates on one that has some;
//   - a mutating webhook writes the merged, pure-AND node affinity into the migration's target
//     virt-launcher pod, so the scheduler can only place it on a candidate;
//   - a validating webhook rejects a migration whose added term is malformed and marks the VMI
//     of one that adds a requirement (LabelConstrainedMigration), so that the target pod's
//     webhook fails closed for that migration alone while virt-rules is down.
//
// The VMI and VM specs are never changed: the constraint lives on the migration and its pod.
package migrationtarget

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

const (
	// ControllerName names the controller in logs and metrics.
	ControllerName = "migrationtarget"
	// FieldManager owns what this controller writes on migrations.
	FieldManager = "virt-rules-migrationtarget"

	// AnnotationAddedTerm carries design 001's added node selector term on a migration, as
	// JSON: KubeVirt's VirtualMachineInstanceMigration has no field for it (the API server drops
	// the design's spec.addedNodeSelectorTerm), so this is where a cluster keeps it.
	AnnotationAddedTerm = "migrations.virt-rules.io/added-node-selector-term"
	// ConditionTargetAvailable is the migration condition this controller writes: True with
	// the candidate nodes, or False with the reason code (engine.Reason*) when there is none.
	ConditionTargetAvailable = "MigrationTargetAvailable"
	// ReasonCandidatesFound is the condition's and Event's reason when there are candidates.
	ReasonCandidatesFound = "CandidatesFound"

	// PhaseFailed is the migration phase KubeVirt and this controller use for a failure.
	PhaseFailed = "Failed"

	// shownCandidates bounds the candidate names a condition message lists.
	shownCandidates = 10
)

// The kinds this controller reads, as stored.
var (
	GVKMigration              = kinds.VirtualMachineInstanceMigration
	GVKVirtualMachineInstance = kinds.VirtualMachineInstance
)

// decisions counts the migrations decided, by result: a reason code or CandidatesFound.
var decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "virtrules_migrationtarget_decisions_total",
	Help: "Migrations with an added node constraint decided by the migrationtarget controller, by result: a reason code (the migration was failed) or CandidatesFound.",
}, []string{"result"})

func init() { metrics.Registry.MustRegister(decisions) }

// Decider is what the controller needs of the engine.
type Decider interface {
	MigrationTarget(ctx context.Context, in engine.MigrationTargetInput) (*engine.MigrationTargetDecision, error)
	MigrationTargetPodAffinity(ctx context.Context, migration *unstructured.Unstructured, podAffinity *corev1.NodeAffinity) (*corev1.NodeAffinity, error)
}

// Reconciler decides each new migration that adds a node constraint.
type Reconciler struct {
	Client client.Client
	// PodReader lists the pods on candidate nodes, whose requests count against the nodes'
	// allocatable. The API server, not a cache: caching every pod of a cluster for a decision
	// made once per migration would cost far more memory than these reads cost time.
	PodReader client.Reader
	// VMIReader reads the whole VMI of a migration: the API server, since the manager's cache
	// keeps VMIs as metadata only (controllers.ManagerOptions). Nil: Client.
	VMIReader client.Reader
	Recorder  record.EventRecorder
	Engine    Decider
	// Nodes is the engine's node view, synced from the informer cache on each decision.
	Nodes *engine.Nodes
	// MaxConcurrentReconciles is how many migrations are decided in parallel (default 1).
	MaxConcurrentReconciles int
	// Shadow, when set, is asked each decision again with the candidate bundle and its own
	// view of the nodes (CandidateNodes), never acted on.
	Shadow         *shadow.Shadow
	CandidateNodes *engine.Nodes

	syncMu sync.Mutex
}

// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstancemigrations,verbs=get;list;watch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstancemigrations/status,verbs=get;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager watches migrations. Only creations and status changes matter: a decision
// is made once, while the migration has not reached a node.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(1, r.MaxConcurrentReconciles)}).
		For(kinds.NewObject(GVKMigration), builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool { return undecided(e.ObjectNew) },
			CreateFunc: func(e event.CreateEvent) bool { return undecided(e.Object) },
		})).
		Complete(r)
}

// Reconcile decides one migration: it reads the migration, its VMI, the nodes and the pods on
// the nodes that could take it, asks the engine, and writes the answer on the migration once.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	migration := kinds.NewObject(GVKMigration)
	if err := r.Client.Get(ctx, req.NamespacedName, migration); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !undecided(migration) {
		return reconcile.Result{}, nil
	}
	// The engine tells whether the migration adds a requirement at all; one that adds none is
	// KubeVirt's alone to place. An invalid term is decided (InvalidTerm) like any other.
	switch affinity, err := r.Engine.MigrationTargetPodAffinity(ctx, migration, nil); {
	case err == nil && affinity == nil:
		return reconcile.Result{}, nil
	case err != nil && !errors.As(err, new(*engine.FieldError)):
		return reconcile.Result{}, err
	}

	vmiName, _, _ := unstructured.NestedString(migration.Object, "spec", "vmiName")
	vmi := kinds.NewObject(GVKVirtualMachineInstance)
	if err := cmp.Or[client.Reader](r.VMIReader, r.Client).Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: vmiName}, vmi); err != nil {
		if client.IgnoreNotFound(err) == nil {
			// KubeVirt fails a migration of a missing VMI itself; nothing to decide here.
			logger.Info("migration names no existing VMI; left to KubeVirt", "vmi", vmiName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("get VMI %s/%s of migration %s: %w", req.Namespace, vmiName, req.Name, err)
	}

	d, err := r.decide(ctx, migration, vmi)
	if err != nil {
		return reconcile.Result{}, err
	}
	if r.Shadow != nil {
		r.compareCandidate(ctx, migration, vmi, d)
	}
	if err := r.record(ctx, migration, d); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// decide asks twice when needed: first without pods, which can only find too many
// candidates, then with the pods of those candidates, so pods are read only for the few
// nodes that could take the VMI.
func (r *Reconciler) decide(ctx context.Context, migration, vmi *unstructured.Unstructured) (*engine.MigrationTargetDecision, error) {
	return r.decideWith(ctx, r.Engine, r.Nodes, migration, vmi)
}

// compareCandidate asks the candidate bundle the same decision, in the background, with
// its own view of the nodes and the pods on its own candidates.
func (r *Reconciler) compareCandidate(ctx context.Context, migration, vmi *unstructured.Unstructured, d *engine.MigrationTargetDecision) {
	key := migration.GetNamespace() + "/" + migration.GetName()
	vmiKey := vmi.GetNamespace() + "/" + vmi.GetName()
	active := &eval.Report{MigrationTargets: []eval.MigrationTargetResult{eval.MigrationTargetResultOf(key, vmiKey, d)}}
	objects := []shadow.Object{{Namespace: migration.GetNamespace(), Name: migration.GetName()}}
	migration, vmi = migration.DeepCopy(), vmi.DeepCopy()
	r.Shadow.Compare(ctx, shadow.DecisionMigrationTargets, objects, active, func(ctx context.Context) (*eval.Report, error) {
		cd, err := r.decideWith(ctx, r.Shadow.Candidate(), r.CandidateNodes, migration, vmi)
		if err != nil {
			return nil, fmt.Errorf("decide migration %s: %w", key, err)
		}
		return &eval.Report{MigrationTargets: []eval.MigrationTargetResult{eval.MigrationTargetResultOf(key, vmiKey, cd)}}, nil
	})
}

// decideWith is decide with eng and its view of the nodes.
func (r *Reconciler) decideWith(ctx context.Context, eng Decider, view *engine.Nodes, migration, vmi *unstructured.Unstructured) (*engine.MigrationTargetDecision, error) {
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	r.syncMu.Lock()
	err := view.Sync(nodes.Items)
	r.syncMu.Unlock()
	if err != nil {
		return nil, err
	}
	source, err := r.sourcePod(ctx, vmi)
	if err != nil {
		return nil, err
	}
	// virt-controller puts the KubeVirt CR's developerConfiguration.nodeSelectors on the
	// target pod as they are now, which the source pod may predate.
	kubevirt, err := kinds.ReadClusterKubeVirt(ctx, r.Client)
	if err != nil {
		return nil, err
	}
	in := engine.MigrationTargetInput{Migration: migration, VMI: vmi, SourcePod: source, KubeVirt: kubevirt, Nodes: view}
	d, err := eng.MigrationTarget(ctx, in)
	if err != nil || d.Error != nil {
		return d, err
	}
	var pods []*unstructured.Unstructured
	for _, node := range d.CandidateNodes {
		onNode, err := r.podsOn(ctx, node)
		if err != nil {
			return nil, err
		}
		pods = append(pods, onNode...)
	}
	in.Pods = pods
	return eng.MigrationTarget(ctx, in)
}

// sourcePod reads the VMI's current virt-launcher pod (labelled kubevirt.io/created-by with
// the VMI's UID, as KubeVirt labels them; engine.SourceLauncherPod picks the current one); nil
// when there is none, and the decision says so in its messages.
func (r *Reconciler) sourcePod(ctx context.Context, vmi *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	var list corev1.PodList
	if err := r.PodReader.List(ctx, &list, client.InNamespace(vmi.GetNamespace()),
		client.MatchingLabels{"kubevirt.io/created-by": string(vmi.GetUID())}); err != nil {
		return nil, fmt.Errorf("list launcher pods of VMI %s/%s: %w", vmi.GetNamespace(), vmi.GetName(), err)
	}
	pods, err := launcher.UnstructuredPods(list.Items)
	if err != nil {
		return nil, err
	}
	return engine.SourceLauncherPod(vmi, pods), nil
}

func (r *Reconciler) podsOn(ctx context.Context, node string) ([]*unstructured.Unstructured, error) {
	var list corev1.PodList
	if err := r.PodReader.List(ctx, &list, client.MatchingFieldsSelector{
		Selector: fields.OneTermEqualSelector("spec.nodeName", node),
	}); err != nil {
		return nil, fmt.Errorf("list pods on node %s: %w", node, err)
	}
	return launcher.UnstructuredPods(list.Items)
}

// record writes the decision: the condition, and for a failure the Failed phase and a
// Warning Event. The patch carries the resourceVersion read, so a concurrent write by
// KubeVirt (virt-controller moves a new migration through its phases within a second) is a
// conflict, never overwritten: the migration is read again and, if still undecided, patched
// again.
func (r *Reconciler) record(ctx context.Context, migration *unstructured.Unstructured, d *engine.MigrationTargetDecision) error {
	cond := map[string]any{
		"type":               ConditionTargetAvailable,
		"status":             string(corev1.ConditionTrue),
		"reason":             ReasonCandidatesFound,
		"message":            candidatesMessage(d.CandidateNodes),
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
		"lastProbeTime":      nil,
	}
	if d.Error != nil {
		cond["status"], cond["reason"], cond["message"] = string(corev1.ConditionFalse), d.Error.Reason, d.Error.Message
	}
	current := migration
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if current == nil {
			current = kinds.NewObject(GVKMigration)
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(migration), current); err != nil {
				return err
			}
			if !undecided(current) {
				return errDecided
			}
		}
		patched := current.DeepCopy()
		conditions, _, _ := unstructured.NestedSlice(patched.Object, "status", "conditions")
		if err := unstructured.SetNestedSlice(patched.Object, append(conditions, cond), "status", "conditions"); err != nil {
			return err
		}
		if d.Error != nil {
			if err := unstructured.SetNestedField(patched.Object, PhaseFailed, "status", "phase"); err != nil {
				return err
			}
		}
		patch := client.MergeFromWithOptions(current, client.MergeFromWithOptimisticLock{})
		err := r.Client.Status().Patch(ctx, patched, patch, client.FieldOwner(FieldManager))
		current = nil // a conflict reads the migration again
		return err
	})
	switch {
	case errors.Is(err, errDecided):
		log.FromContext(ctx).Info("migration moved on before its decision was recorded; left to KubeVirt")
		return nil
	case apierrors.IsNotFound(err):
		return nil // deleted meanwhile
	case err != nil:
		return fmt.Errorf("record migration target of %s/%s: %w", migration.GetNamespace(), migration.GetName(), err)
	}
	logger := log.FromContext(ctx)
	if d.Error != nil {
		decisions.WithLabelValues(d.Error.Reason).Inc()
		logger.Info("migration failed: no target node", "reason", d.Error.Reason, "message", d.Error.Message, "bundleRevision", d.Revision)
		r.Recorder.Event(migration, corev1.EventTypeWarning, d.Error.Reason, d.Error.Message)
		return nil
	}
	decisions.WithLabelValues(ReasonCandidatesFound).Inc()
	logger.Info("migration target decided", "candidates", len(d.CandidateNodes), "bundleRevision", d.Revision)
	return nil
}

// errDecided stops recording a decision on a migration that, read again, was decided or moved
// past scheduling meanwhile.
var errDecided = errors.New("migration no longer undecided")

func candidatesMessage(nodes []string) string {
	shown := nodes[:min(len(nodes), shownCandidates)]
	msg := "candidate nodes: " + strings.Join(shown, ", ")
	if n := len(nodes) - len(shown); n > 0 {
		msg += fmt.Sprintf(" and %d more", n)
	}
	return msg
}

// undecided tells whether obj is a migration not yet decided here that has not reached a
// node: no ConditionTargetAvailable yet, not being deleted, phase unset, Pending or
// Scheduling (KubeVirt may have created the target pod; the scheduler has not placed it).
func undecided(obj client.Object) bool {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GetDeletionTimestamp() != nil {
		return false
	}
	switch phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase {
	case "", "Pending", "Scheduling":
	default:
		return false
	}
	return kinds.Condition(u, ConditionTargetAvailable) == nil
}
