package migrationpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
)

const (
	// StatusControllerName names the status controller in logs and metrics.
	StatusControllerName = "migrationpolicy-status"
	// ConditionValid says whether the policy passes the engine's validation decision.
	ConditionValid = "Valid"

	// indexPolicy indexes VMIs by the policy they obey (their AnnotationPolicy).
	indexPolicy = "virt-rules.io/migration-policy"
)

// Validator is what the status controller needs of the engine.
type Validator interface {
	ValidateMigrationPolicy(ctx context.Context, policy *unstructured.Unstructured, existing []*unstructured.Unstructured) ([]engine.Violation, error)
}

// StatusReconciler keeps each MigrationPolicy's status: the number of VMIs it governs
// (status.virtualMachineInstances) and a Valid condition from the validation decision.
type StatusReconciler struct {
	Client client.Client
	Engine Validator
}

// +kubebuilder:rbac:groups=migrations.kubevirt.io,resources=migrationpolicies/status,verbs=get;patch

// SetupWithManager indexes VMIs by their policy annotation and recounts a policy whenever a
// VMI joins or leaves it.
func (r *StatusReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, kinds.NewObject(GVKVirtualMachineInstance), indexPolicy,
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
		Watches(kinds.NewObject(GVKVirtualMachineInstance), policyOfVMI{}).
		Complete(r)
}

// policyOfVMI enqueues the policies a VMI event can change the count of: before and after.
type policyOfVMI struct{}

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func enqueuePolicy(q queue, o client.Object) {
	if p := o.GetAnnotations()[AnnotationPolicy]; p != "" {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: p}})
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

// Reconcile recounts one policy's VMIs, revalidates it, and patches its status if it changed.
func (r *StatusReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	policy := kinds.NewObject(GVKMigrationPolicy)
	if err := r.Client.Get(ctx, req.NamespacedName, policy); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	vmis := kinds.NewList(GVKVirtualMachineInstance)
	if err := r.Client.List(ctx, vmis, client.MatchingFields{indexPolicy: policy.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, fmt.Errorf("list VMIs of policy %s: %w", policy.GetName(), err)
	}
	violations, err := validate(ctx, r.Client, r.Engine, policy)
	if err != nil {
		return reconcile.Result{}, err
	}
	status := desiredStatus(policy, len(vmis.Items), violations)
	if current, ok := policy.Object["status"].(map[string]any); ok && sameStatus(current, status) {
		return reconcile.Result{}, nil
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.Client.Status().Patch(ctx, policy, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager)); err != nil {
		return reconcile.Result{}, fmt.Errorf("patch status of %s: %w", policy.GetName(), err)
	}
	return reconcile.Result{}, nil
}

func desiredStatus(policy *unstructured.Unstructured, governed int, violations []engine.Violation) map[string]any {
	cond := map[string]any{
		"type": ConditionValid, "status": "True", "reason": "Valid",
		"message":            "the policy passes the bundle's validation decision",
		"observedGeneration": policy.GetGeneration(),
		"lastTransitionTime": nowRFC3339(),
	}
	if len(violations) > 0 {
		cond["status"], cond["reason"], cond["message"] = "False", "Invalid", engine.JoinViolations(violations)
	}
	if prev := kinds.Condition(policy, ConditionValid); prev != nil && prev["status"] == cond["status"] {
		cond["lastTransitionTime"] = prev["lastTransitionTime"]
	}
	return map[string]any{
		"virtualMachineInstances": int64(governed),
		"conditions":              []any{cond},
	}
}

// sameStatus compares statuses as JSON would, so int64 and float64 counts compare equal.
func sameStatus(a, b map[string]any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	if errA != nil || errB != nil {
		return false
	}
	var na, nb any
	_ = json.Unmarshal(ja, &na)
	_ = json.Unmarshal(jb, &nb)
	return reflect.DeepEqual(na, nb)
}

func nowRFC3339() string { return time.Now().UTC().Format(time.RFC3339) }

// validate runs the validation decision on policy against every other MigrationPolicy.
func validate(ctx context.Context, c client.Reader, v Validator, policy *unstructured.Unstructured) ([]engine.Violation, error) {
	all := kinds.NewList(GVKMigrationPolicy)
	if err := c.List(ctx, all); err != nil {
		return nil, fmt.Errorf("list migration policies: %w", err)
	}
	others := make([]*unstructured.Unstructured, 0, len(all.Items))
	for i := range all.Items {
		if all.Items[i].GetName() != policy.GetName() {
			others = append(others, &all.Items[i])
		}
	}
	return v.ValidateMigrationPolicy(ctx, policy, others)
}
