// Package migrationpolicy keeps every VirtualMachineInstance's MigrationPolicy decision on
// the VMI itself, so that at any time every VMI knows which policy it obeys (design 000's
// goal): the policy's name and the effective migration configuration, as annotations.
//
// It reads state, asks the engine, and writes only what changed: a VMI's labels, its
// namespace's labels, any MigrationPolicy or the KubeVirt CR changing re-resolves the VMIs
// they can affect; a VMI whose decision is unchanged is not written.
package migrationpolicy

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

const (
	// ControllerName names the controller in logs and metrics.
	ControllerName = "migrationpolicy"
	// FieldManager owns the annotations this controller writes.
	FieldManager = "virt-rules-migrationpolicy"

	// AnnotationPolicy holds the name of the MigrationPolicy a VMI obeys; absent when none.
	AnnotationPolicy = "migrations.virt-rules.io/policy"
	// AnnotationConfiguration holds the VMI's effective migration configuration as JSON.
	AnnotationConfiguration = "migrations.virt-rules.io/configuration"

	// ReasonPolicyChanged is the Event reason when a VMI's policy or configuration changes.
	ReasonPolicyChanged = "MigrationPolicyChanged"
)

// The kinds this controller reads, as stored (unstructured keeps every field for the rules).
var (
	GVKVirtualMachineInstance = kinds.VirtualMachineInstance
	GVKMigrationPolicy        = kinds.MigrationPolicy
	GVKKubeVirt               = kinds.KubeVirt
)

// Decider is what the controller needs of the engine.
type Decider interface {
	MigrationPolicies(policies []*unstructured.Unstructured, kubevirt *unstructured.Unstructured) (*engine.MigrationPolicies, error)
}

// Reconciler writes each VMI's MigrationPolicy decision onto it.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Sets prepares the policy set decisions are made with.
	Sets *PolicySets
	// MaxConcurrentReconciles is how many VMIs are decided in parallel (default 1).
	MaxConcurrentReconciles int
	// Shadow, when set, is asked each decision again with the candidate bundle's policy
	// sets (CandidateSets), never acted on.
	Shadow        *shadow.Shadow
	CandidateSets *PolicySets
}

// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=kubevirts,verbs=get;list;watch
// +kubebuilder:rbac:groups=migrations.kubevirt.io,resources=migrationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager wires the watches: a VMI's labels, its namespace's labels, every
// MigrationPolicy (the VMIs it can match, before and after a change: selection.go) and the
// KubeVirt CR (every VMI).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(1, r.MaxConcurrentReconciles)}).
		// VMIs are watched and cached as metadata only: the decision reads a VMI's labels and
		// namespace, and at 10,000 VMIs whole objects would be most of the controller's memory.
		For(kinds.NewMetadata(GVKVirtualMachineInstance), builder.WithPredicates(predicate.Or(
			predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.vmisInNamespace),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(kinds.NewObject(GVKMigrationPolicy), handler.EnqueueRequestsFromMapFunc(r.vmisSelected),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(kinds.NewObject(GVKKubeVirt), handler.EnqueueRequestsFromMapFunc(r.allVMIs),
			builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	if r.Shadow != nil {
		// A new candidate revision: every VMI is decided, and so compared, again.
		b = b.WatchesRawSource(source.Channel(r.Shadow.Resyncs(), handler.EnqueueRequestsFromMapFunc(r.allVMIs)))
	}
	return b.Complete(r)
}

// Reconcile decides one VMI's policy and writes the annotations when they differ.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	vmi := kinds.NewMetadata(GVKVirtualMachineInstance)
	if err := r.Client.Get(ctx, req.NamespacedName, vmi); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	set, err := r.Sets.Current(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	subject, err := subjectOf(ctx, r.Client, vmi)
	if err != nil {
		return reconcile.Result{}, err
	}
	d, err := set.Decide(ctx, subject)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("decide %s: %w", req.NamespacedName, err)
	}
	if r.Shadow != nil {
		r.compareCandidate(ctx, subject, d)
	}
	want, err := annotationsFor(d)
	if err != nil {
		return reconcile.Result{}, err
	}
	have := vmi.GetAnnotations()
	if have[AnnotationPolicy] == want[AnnotationPolicy] && have[AnnotationConfiguration] == want[AnnotationConfiguration] &&
		hasKey(have, AnnotationPolicy) == (d.Policy != "") {
		return reconcile.Result{}, nil
	}
	if err := r.patchAnnotations(ctx, vmi, want, d.Policy != ""); err != nil {
		return reconcile.Result{}, fmt.Errorf("annotate %s: %w", req.NamespacedName, err)
	}
	logger.Info("migration policy decided", "policy", d.Policy, "previous", have[AnnotationPolicy], "bundleRevision", d.Revision)
	r.Recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonPolicyChanged,
		"MigrationPolicy %q (was %q), bundle %s", d.Policy, have[AnnotationPolicy], d.Revision)
	return reconcile.Result{}, nil
}

// compareCandidate asks the candidate bundle the same decision, in the background.
func (r *Reconciler) compareCandidate(ctx context.Context, subject engine.MigrationPolicySubject, d *engine.MigrationPolicyDecision) {
	key := subject.Key()
	active := &eval.Report{MigrationPolicies: []eval.MigrationPolicyResult{eval.MigrationPolicyResultOf(key, d)}}
	objects := []shadow.Object{{Namespace: subject.Namespace, Name: subject.Name}}
	r.Shadow.Compare(ctx, shadow.DecisionMigrationPolicies, objects, active, func(ctx context.Context) (*eval.Report, error) {
		set, err := r.CandidateSets.Current(ctx)
		if err != nil {
			return nil, err
		}
		cd, err := set.Decide(ctx, subject)
		if err != nil {
			return nil, fmt.Errorf("decide %s: %w", key, err)
		}
		return &eval.Report{MigrationPolicies: []eval.MigrationPolicyResult{eval.MigrationPolicyResultOf(key, cd)}}, nil
	})
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

// annotationsFor renders a decision as the VMI's annotations; an empty policy is removed.
func annotationsFor(d *engine.MigrationPolicyDecision) (map[string]string, error) {
	cfg, err := json.Marshal(d.Configuration)
	if err != nil {
		return nil, fmt.Errorf("encode configuration: %w", err)
	}
	return map[string]string{AnnotationPolicy: d.Policy, AnnotationConfiguration: string(cfg)}, nil
}

// patchAnnotations merge-patches the two annotations (removing the policy when there is
// none). A merge patch carries no resourceVersion, so concurrent writers never conflict.
func (r *Reconciler) patchAnnotations(ctx context.Context, vmi client.Object, want map[string]string, hasPolicy bool) error {
	annotations := map[string]any{AnnotationConfiguration: want[AnnotationConfiguration], AnnotationPolicy: nil}
	if hasPolicy {
		annotations[AnnotationPolicy] = want[AnnotationPolicy]
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	return r.Client.Patch(ctx, vmi, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager))
}

// subjectOf is what the decision reads of vmi: its labels and its namespace's labels.
func subjectOf(ctx context.Context, c client.Reader, vmi metav1.Object) (engine.MigrationPolicySubject, error) {
	s := engine.MigrationPolicySubject{Namespace: vmi.GetNamespace(), Name: vmi.GetName(), Labels: vmi.GetLabels()}
	var ns corev1.Namespace
	switch err := c.Get(ctx, types.NamespacedName{Name: s.Namespace}, &ns); {
	case err == nil:
		s.NamespaceLabels = ns.Labels
		if s.NamespaceLabels == nil {
			s.NamespaceLabels = map[string]string{}
		}
	case apierrors.IsNotFound(err):
	default:
		return s, fmt.Errorf("get namespace %s: %w", s.Namespace, err)
	}
	return s, nil
}

func (r *Reconciler) vmisInNamespace(ctx context.Context, ns client.Object) []reconcile.Request {
	return r.vmiRequests(ctx, client.InNamespace(ns.GetName()))
}

func (r *Reconciler) allVMIs(ctx context.Context, _ client.Object) []reconcile.Request {
	r.setsChanged()
	return r.vmiRequests(ctx)
}

// setsChanged tells the policy sets of a policy or KubeVirt CR event before its VMIs are
// queued: their reconciles then look at the policies again (PolicySets).
func (r *Reconciler) setsChanged() {
	r.Sets.Changed()
	if r.CandidateSets != nil {
		r.CandidateSets.Changed()
	}
}

// vmisSelected are the VMIs policy can match (selection.go). controller-runtime calls it with
// the old and the new policy on an update, so VMIs either selects are re-decided.
func (r *Reconciler) vmisSelected(ctx context.Context, policy client.Object) []reconcile.Request {
	r.setsChanged()
	u, ok := policy.(*unstructured.Unstructured)
	if !ok {
		return r.vmiRequests(ctx)
	}
	sel := selectionOf(u)
	switch {
	case sel.none:
		return nil
	case sel.all:
		return r.vmiRequests(ctx)
	}
	var namespaces map[string]map[string]string
	if sel.needsNamespaces() {
		var list corev1.NamespaceList
		if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			log.FromContext(ctx).Error(err, "list namespaces to select VMIs; re-resolving every VMI", "policy", u.GetName())
			return r.vmiRequests(ctx)
		}
		namespaces = make(map[string]map[string]string, len(list.Items))
		for _, ns := range list.Items {
			namespaces[ns.Name] = ns.Labels
		}
	}
	return r.vmiRequestsWhere(ctx, func(vmi metav1.Object) bool {
		return sel.selects(vmi.GetLabels(), vmi.GetNamespace(), namespaces[vmi.GetNamespace()])
	})
}

func (r *Reconciler) vmiRequests(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	return r.vmiRequestsWhere(ctx, nil, opts...)
}

// vmiRequestsWhere lists VMIs and requests those keep selects (all when keep is nil).
func (r *Reconciler) vmiRequestsWhere(ctx context.Context, keep func(metav1.Object) bool, opts ...client.ListOption) []reconcile.Request {
	vmis := kinds.NewMetadataList(GVKVirtualMachineInstance)
	if err := r.Client.List(ctx, vmis, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		log.FromContext(ctx).Error(err, "list VMIs to re-resolve")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(vmis.Items))
	for i := range vmis.Items {
		v := &vmis.Items[i]
		if keep != nil && !keep(v) {
			continue
		}
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: v.GetNamespace(), Name: v.GetName()}})
	}
	return reqs
}
