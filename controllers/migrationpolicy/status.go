package migrationpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

const (
	// StatusControllerName names the status controller in logs and metrics.
	StatusControllerName = "migrationpolicy-status"

	// KubeVirt's MigrationPolicy status has no fields (the API server prunes whatever is written
	// there), so what a status would say lives in annotations a kubectl user sees: the number
	// of VMIs that obey the policy, whether it is valid, and why not. The engine names them, as
	// no decision reads them (engine.PolicyStatusAnnotations).

	AnnotationVMIs          = engine.AnnotationPolicyVMIs
	AnnotationValid         = engine.AnnotationPolicyValid
	AnnotationInvalidReason = engine.AnnotationPolicyInvalidReason
	// ReasonInvalid is the reason of the Warning Event on a policy that became invalid.
	ReasonInvalid = "InvalidMigrationPolicy"

	// indexPolicy indexes VMIs by the policy they obey (their AnnotationPolicy).
	indexPolicy = "virt-rules.io/migration-policy"
)

// Validator is the validation decision, as the shadow rollout's candidate engine offers it.
type Validator interface {
	ValidateMigrationPolicyAdmission(ctx context.Context, a engine.MigrationPolicyAdmission, existing *engine.ExistingMigrationPolicies) ([]engine.Violation, error)
}

// StatusReconciler keeps what each MigrationPolicy's status would say in its annotations: the
// number of VMIs it governs (AnnotationVMIs) and whether it passes the validation decision
// (AnnotationValid, AnnotationInvalidReason), with a Warning Event when it becomes invalid.
type StatusReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	Engine   AdmissionValidator
	// Policies holds the stored policies by selector key (WatchPolicies): a policy is validated
	// against those of its own key, as the webhook admits it, not against every policy (at
	// 1,000 policies that was most of the controller's CPU while VMIs were annotated).
	Policies *PolicyIndex
	// Shadow, when set, is asked each validation again with the candidate bundle, in the
	// background and never acted on.
	Shadow *shadow.Shadow
}

// +kubebuilder:rbac:groups=migrations.kubevirt.io,resources=migrationpolicies,verbs=get;patch

// SetupWithManager indexes VMIs by their policy annotation and recounts a policy whenever a
// VMI joins or leaves it.
func (r *StatusReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, kinds.NewMetadata(GVKVirtualMachineInstance), indexPolicy,
		func(o client.Object) []string {
			if p := o.GetAnnotations()[AnnotationPolicy]; p != "" {
				return []string{p}
			}
			return nil
		})
	if err != nil {
		return fmt.Errorf("index VMIs by policy: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(StatusControllerName).
		For(kinds.NewObject(GVKMigrationPolicy)).
		Watches(kinds.NewMetadata(GVKVirtualMachineInstance), policyOfVMI{}).
		Complete(r)
}

// policyOfVMI enqueues the policies a VMI event can change the count of, before and after,
// recountDelay later.
type policyOfVMI struct{}

// recountDelay is how long after a VMI joins or leaves a policy the policy is recounted. One
// change of a policy or a namespace moves many VMIs at once, each annotated in turn: recounted
// on each, a policy was patched again and again (9 policy writes, each through KubeVirt's and
// virt-rules' own policy webhooks, for one namespace's 50 VMIs at the small scale size) while
// the VMIs were still being written. The queue keeps a waiting policy once, so one recount a
// second later counts them all.
const recountDelay = time.Second

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func enqueuePolicy(q queue, o client.Object) {
	if p := o.GetAnnotations()[AnnotationPolicy]; p != "" {
		q.AddAfter(reconcile.Request{NamespacedName: types.NamespacedName{Name: p}}, recountDelay)
	}
}

func (policyOfVMI) Create(_ context.Context, e event.CreateEvent, q queue) {
	enqueuePolicy(q, e.Object)
}
func (policyOfVMI) Delete(_ context.Context, e event.DeleteEvent, q queue) {
	enqueuePolicy(q, e.Object)
}
func (policyOfVMI) Generic(_ context.Context, e event.GenericEvent, q queue) {
	enqueuePolicy(q, e.Object)
}
func (policyOfVMI) Update(_ context.Context, e event.UpdateEvent, q queue) {
	if e.ObjectOld.GetAnnotations()[AnnotationPolicy] != e.ObjectNew.GetAnnotations()[AnnotationPolicy] {
		enqueuePolicy(q, e.ObjectOld)
		enqueuePolicy(q, e.ObjectNew)
	}
}

var _ handler.TypedEventHandler[client.Object, reconcile.Request] = policyOfVMI{}

// Reconcile recounts one policy's VMIs, revalidates it, and patches its annotations if they
// changed.
func (r *StatusReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	policy := kinds.NewObject(GVKMigrationPolicy)
	if err := r.Client.Get(ctx, req.NamespacedName, policy); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	vmis := kinds.NewMetadataList(GVKVirtualMachineInstance)
	if err := r.Client.List(ctx, vmis, client.MatchingFields{indexPolicy: policy.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, fmt.Errorf("list VMIs of policy %s: %w", policy.GetName(), err)
	}
	// The stored policy as such: no old version and no KubeVirt CR, so no feature-gate check,
	// which KubeVirt makes only on setting or changing a gated field, never on what is stored.
	a := engine.MigrationPolicyAdmission{Policy: policy}
	key, err := r.Engine.MigrationPolicyComparisonKey(ctx, policy)
	if err != nil {
		return reconcile.Result{}, err
	}
	a.Key = key
	var cached []engine.KeyedMigrationPolicy
	if key.Compared {
		if cached, err = r.Policies.SameKey(ctx, key.Key); err != nil {
			return reconcile.Result{}, err
		}
	}
	violations, err := r.Engine.ValidateMigrationPolicyAdmission(ctx, a,
		engine.NewKeyedMigrationPolicies(keyedOthers(policy, policiesOf(cached), cached)))
	if err != nil {
		return reconcile.Result{}, err
	}
	if r.Shadow != nil {
		// The candidate bundle may key policies otherwise: it is asked against every policy.
		all, err := r.Policies.All(ctx)
		if err != nil {
			return reconcile.Result{}, err
		}
		compareValidation(ctx, r.Shadow, a, othersThan(policy, all), violations)
	}
	want := statusAnnotations(len(vmis.Items), violations)
	have := policy.GetAnnotations()
	changed := map[string]any{}
	for _, key := range []string{AnnotationVMIs, AnnotationValid, AnnotationInvalidReason} {
		if v, ok := want[key]; ok && have[key] != v {
			changed[key] = v
		} else if _, had := have[key]; !ok && had {
			changed[key] = nil
		}
	}
	if len(changed) == 0 {
		return reconcile.Result{}, nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": changed}})
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.Client.Patch(ctx, policy, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager)); err != nil {
		return reconcile.Result{}, fmt.Errorf("annotate %s: %w", policy.GetName(), err)
	}
	if want[AnnotationValid] == "false" && have[AnnotationValid] != "false" && r.Recorder != nil {
		r.Recorder.Event(policy, corev1.EventTypeWarning, ReasonInvalid, want[AnnotationInvalidReason])
	}
	return reconcile.Result{}, nil
}

// statusAnnotations is what the policy's annotations should say.
func statusAnnotations(governed int, violations []engine.Violation) map[string]string {
	if len(violations) > 0 {
		return map[string]string{
			AnnotationVMIs:          strconv.Itoa(governed),
			AnnotationValid:         "false",
			AnnotationInvalidReason: engine.JoinViolations(violations),
		}
	}
	return map[string]string{AnnotationVMIs: strconv.Itoa(governed), AnnotationValid: "true"}
}

// othersThan is every policy of all but the one named as policy.
func othersThan(policy *unstructured.Unstructured, all []*unstructured.Unstructured) []*unstructured.Unstructured {
	others := make([]*unstructured.Unstructured, 0, len(all))
	for _, p := range all {
		if p.GetName() != policy.GetName() {
			others = append(others, p)
		}
	}
	return others
}
