// Package reports keeps virt-rules' decisions as OpenReports objects (openreports.io, the
// successor of wgpolicyk8s.io's PolicyReport), the reports Kyverno writes and report
// dashboards such as Policy Reporter read:
//
//   - per namespace, a Report named virt-rules: one result per MigrationPolicy its VMIs obey
//     (with the VMI count), one per migration whose added node-selector term left no
//     candidate (fail) or was refused (error) with the reason code, one counting the
//     migrations that had candidates;
//   - a ClusterReport named virt-rules: every MigrationPolicy, valid (pass) or invalid (fail,
//     with the validation's message), and the nodes counted per migratability level.
//
// It decides nothing: it reads what the other controllers wrote (annotations, labels, status
// conditions). Reports are bounded (Compose) and written only when their content changes.
// Without the OpenReports CRDs the controller is not started, with a warning.
package reports

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	openreports "github.com/openreports/reports-api/apis/openreports.io/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

const (
	// ControllerName names the controller in logs and metrics.
	ControllerName = "reports"
	// FieldManager owns the reports.
	FieldManager = "virt-rules-reports"
	// Name is the name of every report this controller writes.
	Name = "virt-rules"
	// Source is the source the reports and their results name.
	Source = "virt-rules"
	// LabelManagedBy marks the reports as virt-rules' (value ManagedBy); a report of that name
	// without it is someone else's and left alone.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "virt-rules"
	// AnnotationOmitted holds how many results were left out of a report to keep it within
	// MaxBytes (absent when none); its summary still counts them.
	AnnotationOmitted = "reports.virt-rules.io/omitted-results"
	// MaxBytes bounds a stored report.
	MaxBytes = 1 << 20
	// DefaultDebounce is how long after a change a report is rewritten, so that a burst of
	// changes in a namespace costs one write.
	DefaultDebounce = time.Second
)

// The OpenReports kinds, as the CRDs serve them.
var (
	GVKReport        = openreports.SchemeGroupVersion.WithKind("Report")
	GVKClusterReport = openreports.SchemeGroupVersion.WithKind("ClusterReport")
)

// writes counts report writes, by kind and action.
var writes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "virtrules_reports_writes_total",
	Help: "OpenReports objects written by the reports controller, by kind (Report, ClusterReport) and action (create, update, delete).",
}, []string{"kind", "action"})

func init() { metrics.Registry.MustRegister(writes) }

// clusterKey is the work item of the ClusterReport; a namespace's Report is {ns, Name}.
var clusterKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: Name}}

// Reconciler writes the reports.
type Reconciler struct {
	Client client.Client
	// MaxBytes bounds each report (default and at most MaxBytes).
	MaxBytes int
	// Debounce delays a report's rewrite after a change (default DefaultDebounce).
	Debounce time.Duration
	// Now is the clock new results are stamped with (default time.Now).
	Now func() time.Time
	// Shadow, when set, adds the decisions a candidate bundle makes differently.
	Shadow *shadow.Shadow
	// Engine, when set, adds the nodes' CPU baseline (one result per group).
	Engine *engine.Engine
}

// Available tells whether the cluster serves both OpenReports kinds.
func Available(mapper meta.RESTMapper) (bool, error) {
	for _, gvk := range []schema.GroupVersionKind{GVKReport, GVKClusterReport} {
		_, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("look up %s: %w", gvk, err)
		}
	}
	return true, nil
}

// +kubebuilder:rbac:groups=openreports.io,resources=reports;clusterreports,verbs=get;list;watch;create;patch;delete

// SetupWithManager wires the watches, unless the cluster lacks the OpenReports CRDs: then it
// logs a warning and the other controllers run without reports.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	ok, err := Available(mgr.GetRESTMapper())
	if err != nil {
		return err
	}
	if !ok {
		mgr.GetLogger().Info("WARNING: the OpenReports CRDs (openreports.io/v1alpha1 Report, ClusterReport) are not installed; "+
			"the reports controller is not started (install them and restart virt-rules to get reports)", "controller", ControllerName)
		return nil
	}
	delay := r.Debounce
	if delay <= 0 {
		delay = DefaultDebounce
	}
	inNamespace := func(o client.Object) (reconcile.Request, bool) {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: Name}}, true
	}
	cluster := func(client.Object) (reconcile.Request, bool) { return clusterKey, true }
	itself := func(o client.Object) (reconcile.Request, bool) {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: Name}}, o.GetName() == Name
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(controller.Options{RateLimiter: workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, 5*time.Minute),
			&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rateLimiter()},
		)}).
		Watches(kinds.NewMetadata(kinds.VirtualMachineInstance), debounced{inNamespace, delay, vmiChanged}).
		Watches(kinds.NewObject(kinds.VirtualMachineInstanceMigration), debounced{inNamespace, delay, anyChange}).
		Watches(kinds.NewObject(kinds.MigrationPolicy), debounced{cluster, delay, annotationsChanged}).
		Watches(&corev1.Node{}, debounced{cluster, delay, r.nodeChanged}).
		Watches(kinds.NewObject(GVKReport), debounced{itself, 0, anyChange}).
		Watches(kinds.NewObject(GVKClusterReport), debounced{itself, 0, anyChange})
	if r.Shadow != nil {
		b = b.WatchesRawSource(source.Channel(r.Shadow.Changes(), debounced{inNamespace, delay, anyChange}))
	}
	return b.Complete(r)
}

// Reconcile rewrites one report from what is stored now.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Namespace == "" {
		facts, err := r.clusterFacts(ctx)
		if err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, r.write(ctx, GVKClusterReport, "", ClusterResults(facts))
	}
	facts, err := r.namespaceFacts(ctx, req.Namespace)
	if err != nil {
		return reconcile.Result{}, err
	}
	if facts.Empty() {
		return reconcile.Result{}, r.remove(ctx, req.Namespace)
	}
	return reconcile.Result{}, r.write(ctx, GVKReport, req.Namespace, NamespaceResults(facts))
}

// namespaceFacts reads what the migrationpolicy and migrationtarget controllers wrote in ns.
func (r *Reconciler) namespaceFacts(ctx context.Context, ns string) (NamespaceFacts, error) {
	f := NamespaceFacts{Namespace: ns, VMIs: map[string]int{}}
	if r.Shadow != nil {
		f.Differences = r.Shadow.Differences(ns)
	}
	vmis := kinds.NewMetadataList(kinds.VirtualMachineInstance)
	if err := r.Client.List(ctx, vmis, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return f, fmt.Errorf("list VMIs in %s: %w", ns, err)
	}
	for _, v := range vmis.Items {
		a := v.GetAnnotations()
		if _, decided := a[migrationpolicy.AnnotationConfiguration]; decided {
			f.VMIs[a[migrationpolicy.AnnotationPolicy]]++
		}
	}
	migrations := kinds.NewList(kinds.VirtualMachineInstanceMigration)
	if err := r.Client.List(ctx, migrations, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return f, fmt.Errorf("list migrations in %s: %w", ns, err)
	}
	for i := range migrations.Items {
		m := &migrations.Items[i]
		c := kinds.Condition(m, migrationtarget.ConditionTargetAvailable)
		switch {
		case c == nil:
		case c["status"] == string(corev1.ConditionTrue):
			f.WithCandidates++
		default:
			vmi, _, _ := unstructured.NestedString(m.Object, "spec", "vmiName")
			reason, _ := c["reason"].(string)
			message, _ := c["message"].(string)
			at, _ := c["lastTransitionTime"].(string)
			t, _ := time.Parse(time.RFC3339, at) // zero when absent or malformed
			f.Failed = append(f.Failed, FailedMigration{Name: m.GetName(), UID: string(m.GetUID()), VMI: vmi, Reason: reason, Message: message, Time: t})
		}
	}
	return f, nil
}

// clusterFacts reads what the migrationpolicy status and nodelabeller controllers wrote.
func (r *Reconciler) clusterFacts(ctx context.Context) (ClusterFacts, error) {
	f := ClusterFacts{Levels: map[string]int{}}
	if r.Shadow != nil {
		f.Differences = r.Shadow.Differences("")
	}
	policies := kinds.NewList(kinds.MigrationPolicy)
	if err := r.Client.List(ctx, policies, client.UnsafeDisableDeepCopy); err != nil {
		return f, fmt.Errorf("list migration policies: %w", err)
	}
	for _, p := range policies.Items {
		a := p.GetAnnotations()
		f.Policies = append(f.Policies, PolicyValidity{
			Name: p.GetName(), UID: string(p.GetUID()), Valid: a[migrationpolicy.AnnotationValid],
			Reason: a[migrationpolicy.AnnotationInvalidReason], VMIs: a[migrationpolicy.AnnotationVMIs],
		})
	}
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return f, fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		f.Levels[n.Labels[nodelabeller.LabelLevel]]++
	}
	if r.Engine != nil {
		view := r.Engine.NewLevelNodes()
		if err := view.Sync(nodes.Items); err != nil {
			return f, fmt.Errorf("cpu baseline: %w", err)
		}
		b, err := view.CPUBaseline(ctx, "")
		if err != nil && !errors.Is(err, engine.ErrMissingDecision) {
			return f, err
		}
		if b != nil {
			f.Baseline = b.Groups
		}
	}
	return f, nil
}

// write creates or updates the report of kind gvk in ns ("" for the cluster) with results,
// bounded, unless what is stored already says the same.
func (r *Reconciler) write(ctx context.Context, gvk schema.GroupVersionKind, ns string, results []openreports.ReportResult) error {
	current := kinds.NewObject(gvk)
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: Name}, current)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get %s %s/%s: %w", gvk.Kind, ns, Name, err)
	}
	var prev openreports.Report
	if exists {
		if current.GetLabels()[LabelManagedBy] != ManagedBy {
			log.FromContext(ctx).Info("a report of virt-rules' name is not labelled as virt-rules'; left alone", "kind", gvk.Kind, "namespace", ns, "label", LabelManagedBy)
			return nil
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(current.Object, &prev); err != nil {
			return fmt.Errorf("decode %s %s/%s: %w", gvk.Kind, ns, Name, err)
		}
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	maxBytes := MaxBytes
	if r.MaxBytes > 0 {
		maxBytes = min(r.MaxBytes, MaxBytes)
	}
	c, err := Compose(results, prev.Results, now(), maxBytes)
	if err != nil {
		return fmt.Errorf("compose %s %s/%s: %w", gvk.Kind, ns, Name, err)
	}
	labels, annotations := maps.Clone(prev.Labels), maps.Clone(prev.Annotations)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy] = ManagedBy
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, AnnotationOmitted)
	if c.Omitted > 0 {
		annotations[AnnotationOmitted] = strconv.Itoa(c.Omitted)
	}
	if exists && prev.Source == Source && equality.Semantic.DeepEqual(prev.Summary, c.Summary) &&
		equality.Semantic.DeepEqual(prev.Results, c.Results) && maps.Equal(prev.Labels, labels) &&
		maps.Equal(prev.Annotations, annotations) {
		return nil
	}
	want := openreports.Report{Source: Source, Summary: c.Summary, Results: c.Results}
	want.Labels, want.Annotations = labels, annotations
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&want)
	if err != nil {
		return fmt.Errorf("encode %s %s/%s: %w", gvk.Kind, ns, Name, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(ns)
	u.SetName(Name)
	if len(annotations) == 0 {
		u.SetAnnotations(nil)
	}
	// An update is a merge patch without a resourceVersion: the report is virt-rules' alone,
	// and the cache may lag behind the last write (an optimistic update would conflict every
	// time in a burst of changes). What the write was based on is checked again when the
	// cache sees it (the report's own watch); a write of the same content changes nothing.
	action := "create"
	if exists {
		action = "update"
		var patch client.Patch
		if patch, err = mergePatch(c, annotations[AnnotationOmitted]); err == nil {
			err = r.Client.Patch(ctx, u, patch, client.FieldOwner(FieldManager))
		}
	} else {
		err = r.Client.Create(ctx, u, client.FieldOwner(FieldManager))
	}
	if apierrors.IsAlreadyExists(err) {
		return errCacheBehind // created meanwhile, or created by the last pass and not cached yet
	}
	if err != nil {
		return fmt.Errorf("%s %s %s/%s: %w", action, gvk.Kind, ns, Name, err)
	}
	writes.WithLabelValues(gvk.Kind, action).Inc()
	log.FromContext(ctx).V(1).Info("report written", "kind", gvk.Kind, "namespace", ns, "results", len(c.Results), "omitted", c.Omitted)
	return nil
}

// mergePatch sets the report's content: every field it writes, the results as a whole (null
// when none), the omitted-results annotation (removed when omitted is "").
func mergePatch(c Content, omitted string) (client.Patch, error) {
	var omittedValue any
	if omitted != "" {
		omittedValue = omitted
	}
	results := c.Results
	if len(results) == 0 {
		results = nil
	}
	patch := map[string]any{
		"metadata": map[string]any{
			"labels":      map[string]any{LabelManagedBy: ManagedBy},
			"annotations": map[string]any{AnnotationOmitted: omittedValue},
		},
		"source":  Source,
		"summary": c.Summary,
		"results": results,
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encode report patch: %w", err)
	}
	return client.RawPatch(types.MergePatchType, data), nil
}

// errCacheBehind is returned, to retry with backoff, when the cache has not seen a report
// that exists.
var errCacheBehind = errors.New("the report exists but is not cached yet")

// remove deletes ns's report, when it is virt-rules', once the namespace has nothing to report.
func (r *Reconciler) remove(ctx context.Context, ns string) error {
	current := kinds.NewObject(GVKReport)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: Name}, current); err != nil {
		return client.IgnoreNotFound(err)
	}
	if current.GetLabels()[LabelManagedBy] != ManagedBy {
		return nil
	}
	err := r.Client.Delete(ctx, current, client.Preconditions{UID: ptr.To(current.GetUID())})
	if err = client.IgnoreNotFound(err); err != nil {
		return fmt.Errorf("delete Report %s/%s: %w", ns, Name, err)
	}
	writes.WithLabelValues(GVKReport.Kind, "delete").Inc()
	return nil
}
