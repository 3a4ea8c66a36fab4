// Package pool runs VirtualMachinePools (pool.virt-rules.io/v1alpha1, design 003): it reads a
// pool, its VirtualMachines, their VMIs and the DataVolumes kept for it, asks the engine for
// the plan (rego/virtrules/pool) and applies it, then writes the pool's status.
//
// Names are the idempotency key: a VM is created under the name the plan gives, an existing
// one is never created twice, and preserved DataVolumes are marked kept before their VM goes,
// so a crash at any point and a restart converge on exactly spec.replicas VMs without losing
// kept state. Only the leader runs it.
package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	poolv1alpha1 "github.com/virt-rules/virt-rules/api/pool/v1alpha1"
	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

const (
	// ControllerName names the controller in logs, metrics and Events.
	ControllerName = "pool"
	// FieldManager owns what this controller writes.
	FieldManager = "virt-rules-pool"

	// LabelPool is on every VM of a pool: the pool's name.
	LabelPool = "pool.virt-rules.io/pool"
	// LabelPreserved is on every DataVolume kept by Offline state preservation: the name of
	// the pool that kept it.
	LabelPreserved = "pool.virt-rules.io/preserved"
	// AnnotationTemplateHash is on VMs (and their VMI template): the template they come from.
	AnnotationTemplateHash = "pool.virt-rules.io/template-hash"
	// AnnotationPreservedPool is on kept DataVolumes: the UID of the pool that kept them.
	AnnotationPreservedPool = "pool.virt-rules.io/preserved-pool-uid"
	// AnnotationPreservedVM is on kept DataVolumes: the name of the VM they belong to.
	AnnotationPreservedVM = "pool.virt-rules.io/preserved-vm"

	// Event reasons, one per action.
	ReasonCreated       = "Created"
	ReasonDeleted       = "Deleted"
	ReasonStateKept     = "StateKept"
	ReasonUpdated       = "Updated"
	ReasonRestarted     = "Restarted"
	ReasonReprovisioned = "Reprovisioned"
	ReasonReclaimed     = "StateReclaimed"
	ReasonFailed        = "Failed"
)

// The kinds this controller reads and writes, as stored.
var (
	GVKPool           = poolv1alpha1.GroupVersion.WithKind(poolv1alpha1.Kind)
	GVKVirtualMachine = kinds.VirtualMachine
	GVKVMI            = kinds.VirtualMachineInstance
	GVKDataVolume     = kinds.DataVolume
)

// Reconciler applies pool plans.
type Reconciler struct {
	// Client reads from the cache and writes.
	Client client.Client
	// APIReader reads from the API server, for read-modify-write retried on conflicts.
	APIReader client.Reader
	// VMIs is the cache of VMIs plans read (NewVMICache), run by SetupWithManager; nil: the
	// manager's (Client).
	VMIs     cache.Cache
	Recorder record.EventRecorder
	Engine   *engine.Engine
	// BurstLimit caps the VMs one pass creates or updates; 0 is engine.DefaultPoolBurstLimit.
	BurstLimit int
	// Now is the clock plans are made with; nil is time.Now.
	Now                     func() time.Time
	MaxConcurrentReconciles int
	// PlanInterval is the least time between two plans of a pool that updates of its VMs and
	// VMIs ask for (pace.go); 0 is DefaultPlanInterval, a negative one plans on every update.
	PlanInterval time.Duration
	// Shadow, when set, is asked each plan again with the candidate bundle, never acted on.
	Shadow *shadow.Shadow

	expectations expectations
	metrics      vmiObserver
	pacer        *pacer
	// dataVolumes: CDI's DataVolume kind is served. Without CDI no VM can have kept state, and
	// watching a kind that is not served would stop the manager once its cache times out.
	dataVolumes bool
}

// +kubebuilder:rbac:groups=pool.virt-rules.io,resources=virtualmachinepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=pool.virt-rules.io,resources=virtualmachinepools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachines,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=kubevirt.io,resources=virtualmachineinstances,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes,verbs=get;list;watch;update;patch;delete

// SetupWithManager watches pools, their VMs (by controller owner), the VMIs of those VMs
// and the DataVolumes kept for them.
// DataVolumes are watched only when CDI serves them when the controller starts.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.expectations.init()
	r.metrics.init()
	r.pacer = newPacer(r.PlanInterval, nil)
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), kinds.NewObject(GVKVirtualMachine), indexPoolName, poolNamesOfVM); err != nil {
		return fmt.Errorf("index VirtualMachines by pool: %w", err)
	}
	pool := kinds.NewObject(GVKPool)
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(pool).
		Watches(kinds.NewObject(GVKVirtualMachine), r.pacer.paced(handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), pool, handler.OnlyControllerOwner())))
	if r.VMIs != nil {
		if err := mgr.Add(r.VMIs); err != nil {
			return fmt.Errorf("run the pool controller's VMI cache: %w", err)
		}
		b = b.WatchesRawSource(source.Kind[client.Object](r.VMIs, kinds.NewObject(GVKVMI), r.pacer.paced(handler.EnqueueRequestsFromMapFunc(r.poolOfVMI))))
	} else {
		b = b.Watches(kinds.NewObject(GVKVMI), r.pacer.paced(handler.EnqueueRequestsFromMapFunc(r.poolOfVMI)))
	}
	switch _, err := mgr.GetRESTMapper().RESTMapping(GVKDataVolume.GroupKind(), GVKDataVolume.Version); {
	case err == nil:
		r.dataVolumes = true
		b = b.Watches(kinds.NewObject(GVKDataVolume), handler.EnqueueRequestsFromMapFunc(poolOfVolume))
	case meta.IsNoMatchError(err):
		mgr.GetLogger().Info("CDI's DataVolume kind is not served: pools keep no VM state (restart virt-rules once CDI is installed)", "controller", ControllerName)
	default:
		return fmt.Errorf("look up %s: %w", GVKDataVolume, err)
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: max(1, r.MaxConcurrentReconciles)}).Complete(r)
}

// poolOfVMI maps a VMI to the pool owning the VM of the same name.
func (r *Reconciler) poolOfVMI(ctx context.Context, obj client.Object) []reconcile.Request {
	vm := kinds.NewObject(GVKVirtualMachine)
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), vm); err != nil {
		return nil
	}
	if ref := metav1.GetControllerOf(vm); ref != nil && ref.Kind == poolv1alpha1.Kind {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
	}
	return nil
}

func poolOfVolume(_ context.Context, obj client.Object) []reconcile.Request {
	if name := obj.GetLabels()[LabelPreserved]; name != "" {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
	}
	return nil
}

// compareCandidate asks the candidate bundle for the same plan, in the background, on a copy
// of the pool's world.
func (r *Reconciler) compareCandidate(ctx context.Context, key types.NamespacedName, in engine.PoolInput, plan *engine.PoolPlan) {
	active := &eval.Report{Pools: []eval.PoolResult{eval.PoolResultOf(key.String(), plan)}}
	in.Pool = in.Pool.DeepCopy()
	in.VMs, in.VMIs, in.Volumes = deepCopies(in.VMs), deepCopies(in.VMIs), deepCopies(in.Volumes)
	objects := []shadow.Object{{Namespace: key.Namespace, Name: key.Name}}
	r.Shadow.Compare(ctx, shadow.DecisionPools, objects, active, func(ctx context.Context) (*eval.Report, error) {
		cp, err := r.Shadow.Candidate().PoolPlan(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("plan VirtualMachinePool %s: %w", key, err)
		}
		return &eval.Report{Pools: []eval.PoolResult{eval.PoolResultOf(key.String(), cp)}}, nil
	})
}

func deepCopies(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopy()
	}
	return out
}

// Reconcile reads the pool's world, asks for the plan, applies it and writes the status.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	pool := kinds.NewObject(GVKPool)
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.expectations.forget(req.NamespacedName)
			r.metrics.forget(req.String())
			r.pacer.forget(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("get VirtualMachinePool %s: %w", req, err)
	}
	if pool.GetDeletionTimestamp() != nil {
		return reconcile.Result{}, nil // its VMs go with it (ownerReferences)
	}
	r.pacer.planned(req.NamespacedName)
	in, err := r.gather(ctx, pool)
	if err != nil {
		return reconcile.Result{}, err
	}
	r.metrics.observe(req.String(), in.VMIs)
	if !r.expectations.met(req.NamespacedName, in.VMs, in.VMIs) {
		// The cache has not seen all the last pass did: a plan now would redo it. The
		// watch events still to come wake this pool; the requeue is a safety net.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	plan, err := r.Engine.PoolPlan(ctx, in)
	if err != nil {
		if errors.Is(err, engine.ErrMalformedInput) {
			// The CRD refuses such pools; one stored before it did waits for a fix.
			r.Recorder.Event(pool, corev1.EventTypeWarning, ReasonFailed, err.Error())
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if r.Shadow != nil {
		r.compareCandidate(ctx, req.NamespacedName, in, plan)
	}
	applyErr := r.apply(ctx, pool, in, plan)
	if err := r.writeStatus(ctx, pool, plan, applyErr); err != nil {
		return reconcile.Result{}, errors.Join(applyErr, err)
	}
	if applyErr != nil {
		return reconcile.Result{}, applyErr
	}
	if n := len(plan.Create) + len(plan.Delete) + len(plan.Update) + len(plan.Restart) + len(plan.Reprovision); n > 0 {
		logger.Info("pool plan applied", "create", len(plan.Create), "delete", len(plan.Delete), "update", len(plan.Update),
			"restart", len(plan.Restart), "reprovision", len(plan.Reprovision), "bundleRevision", plan.Revision)
	}
	if plan.RequeueAfter != nil {
		return reconcile.Result{RequeueAfter: max(*plan.RequeueAfter, 10*time.Millisecond)}, nil
	}
	return reconcile.Result{}, nil
}

// gather lists what the plan reads, from the cache: read only.
func (r *Reconciler) gather(ctx context.Context, pool *unstructured.Unstructured) (engine.PoolInput, error) {
	ns := client.InNamespace(pool.GetNamespace())
	in := engine.PoolInput{Pool: pool, BurstLimit: r.BurstLimit, Now: time.Now()}
	if r.Now != nil {
		in.Now = r.Now()
	}
	// Only this pool's candidates, by the index: a namespace of many pools would otherwise
	// copy every VM of every pool on each pass.
	// The cache's own objects, not copies (UnsafeDisableDeepCopy): a plan only reads them, and
	// writes go to objects read afresh from the API server (write); the shadow comparison
	// copies what it keeps. Copying 1,000 VMs and their VMIs on every pass was a fifth of the
	// controller's CPU while the pools started at make scale's full size.
	vms := kinds.NewList(GVKVirtualMachine)
	if err := r.Client.List(ctx, vms, ns, client.MatchingFields{indexPoolName: pool.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		return in, fmt.Errorf("list VirtualMachines of pool %s/%s: %w", pool.GetNamespace(), pool.GetName(), err)
	}
	prefix := pool.GetName() + "-"
	for i := range vms.Items {
		vm := &vms.Items[i]
		ref := metav1.GetControllerOf(vm)
		if (ref != nil && ref.UID == pool.GetUID()) || strings.HasPrefix(vm.GetName(), prefix) {
			in.VMs = append(in.VMs, vm)
		}
	}
	var reader client.Reader = r.Client
	if r.VMIs != nil {
		reader = r.VMIs
	}
	for _, vm := range in.VMs {
		vmi := kinds.NewObject(GVKVMI)
		err := reader.Get(ctx, client.ObjectKeyFromObject(vm), vmi, client.UnsafeDisableDeepCopy)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return in, fmt.Errorf("get the VirtualMachineInstance of VirtualMachine %s/%s: %w", vm.GetNamespace(), vm.GetName(), err)
		}
		// A VMI no VirtualMachine controls is not a VM's VMI, even of the same name.
		if !isStub(vmi) {
			in.VMIs = append(in.VMIs, vmi)
		}
	}
	if !r.dataVolumes {
		return in, nil
	}
	dvs := kinds.NewList(GVKDataVolume)
	if err := r.Client.List(ctx, dvs, ns, client.HasLabels{LabelPreserved}); err != nil {
		return in, fmt.Errorf("list preserved DataVolumes in %s: %w", pool.GetNamespace(), err)
	}
	for i := range dvs.Items {
		in.Volumes = append(in.Volumes, &dvs.Items[i])
	}
	return in, nil
}

// apply carries out plan, in an order that a crash at any point leaves recoverable:
// autohealing records before re-provisioning, kept volumes marked before their VM goes.
func (r *Reconciler) apply(ctx context.Context, pool *unstructured.Unstructured, in engine.PoolInput, plan *engine.PoolPlan) error {
	key := client.ObjectKeyFromObject(pool)
	vms := map[string]*unstructured.Unstructured{}
	for _, vm := range in.VMs {
		vms[vm.GetName()] = vm
	}
	vmiUIDs := map[string]types.UID{}
	for _, vmi := range in.VMIs {
		vmiUIDs[vmi.GetName()] = vmi.GetUID()
	}
	done := &expectation{updated: map[string]string{}, restarted: map[string]types.UID{}}
	// Events go on the VM acted on (rate limits are per object: a pool-wide burst of
	// creates would otherwise lose most of its Events), naming the pool.
	poolName := pool.GetName()
	var errs []error
	fail := func(err error) {
		if err != nil {
			errs = append(errs, err)
			r.Recorder.Event(pool, corev1.EventTypeWarning, ReasonFailed, err.Error())
		}
	}
	if len(plan.Reprovision) > 0 {
		// The backoff must survive the VM: record it first.
		if err := r.writeStatus(ctx, pool, plan, nil); err != nil {
			return err
		}
	}
	for _, rc := range plan.Reclaim {
		fail(r.reclaim(ctx, pool, rc, vms[rc.VM]))
	}
	for _, d := range plan.Delete {
		if err := r.deleteVM(ctx, pool, vms[d.Name], d.Volumes, d.PreserveState); err != nil {
			fail(err)
			continue
		}
		done.deleted = append(done.deleted, d.Name)
		if d.PreserveState {
			r.Recorder.Eventf(vms[d.Name], corev1.EventTypeNormal, ReasonStateKept, "Pool %s deleted VirtualMachine %s (scale-in), keeping its DataVolumes %s", poolName, d.Name, strings.Join(d.Volumes, ", "))
		} else {
			r.Recorder.Eventf(vms[d.Name], corev1.EventTypeNormal, ReasonDeleted, "Pool %s deleted VirtualMachine %s and its DataVolumes (scale-in)", poolName, d.Name)
		}
	}
	for _, rp := range plan.Reprovision {
		if err := r.deleteVM(ctx, pool, vms[rp.Name], rp.Volumes, false); err != nil {
			fail(err)
			continue
		}
		done.deleted = append(done.deleted, rp.Name)
		r.Recorder.Eventf(vms[rp.Name], corev1.EventTypeNormal, ReasonReprovisioned, "Pool %s deleted VirtualMachine %s and its state after repeated start failures; it is created afresh", poolName, rp.Name)
	}
	for _, u := range plan.Update {
		if err := r.updateVM(ctx, vms[u.Name], u.VM); err != nil {
			fail(err)
			continue
		}
		done.updated[u.Name] = hashOf(u.VM)
		r.Recorder.Eventf(vms[u.Name], corev1.EventTypeNormal, ReasonUpdated, "Pool %s updated VirtualMachine %s to template %s", poolName, u.Name, hashOf(u.VM))
	}
	for _, name := range plan.Restart {
		vmi := kinds.NewObject(GVKVMI)
		vmi.SetNamespace(pool.GetNamespace())
		vmi.SetName(name)
		if err := client.IgnoreNotFound(r.Client.Delete(ctx, vmi)); err != nil {
			fail(fmt.Errorf("restart VirtualMachine %s/%s: delete its VMI: %w", pool.GetNamespace(), name, err))
			continue
		}
		if uid, ok := vmiUIDs[name]; ok {
			done.restarted[name] = uid
		}
		r.Recorder.Eventf(vms[name], corev1.EventTypeNormal, ReasonRestarted, "Pool %s restarted VirtualMachine %s to run its new template", poolName, name)
	}
	created := make([]bool, len(plan.Create))
	fail(slowStart(len(plan.Create), func(i int) error {
		c := plan.Create[i]
		vm, err := r.createVM(ctx, pool, c)
		if err != nil || vm == nil {
			return err
		}
		created[i] = true
		msg := "Pool " + poolName + " created VirtualMachine " + c.Name
		if len(c.Reuse) > 0 {
			msg += " with its kept DataVolumes " + strings.Join(c.Reuse, ", ")
		}
		r.Recorder.Event(vm, corev1.EventTypeNormal, ReasonCreated, msg)
		return nil
	}))
	for i, c := range plan.Create {
		if created[i] {
			done.created = append(done.created, c.Name)
		}
	}
	r.expectations.expect(key, done)
	if len(plan.Create) > 0 {
		createsPerPass.WithLabelValues(key.String()).Observe(float64(len(done.created)))
	}
	return errors.Join(errs...)
}

func hashOf(vm map[string]any) string {
	h, _, _ := unstructured.NestedString(vm, "metadata", "annotations", AnnotationTemplateHash)
	return h
}

// createVM creates the planned VM. An existing VM of that name is the idempotency key at
// work (a pass whose cache lagged, or a previous leader): not an error, not created again.
func (r *Reconciler) createVM(ctx context.Context, pool *unstructured.Unstructured, c engine.PoolCreate) (*unstructured.Unstructured, error) {
	vm := &unstructured.Unstructured{Object: c.VM}
	err := r.Client.Create(ctx, vm, client.FieldOwner(FieldManager))
	if apierrors.IsAlreadyExists(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("create VirtualMachine %s/%s: %w", pool.GetNamespace(), c.Name, err)
	}
	return vm, nil
}

// updateVM brings the VM's spec, labels and annotations to want, retried on conflicts.
func (r *Reconciler) updateVM(ctx context.Context, current *unstructured.Unstructured, want map[string]any) error {
	if current == nil {
		return nil
	}
	wantVM := &unstructured.Unstructured{Object: want}
	return r.update(ctx, GVKVirtualMachine, client.ObjectKeyFromObject(current), current.GetUID(), func(vm *unstructured.Unstructured) bool {
		vm.Object["spec"] = runtime.DeepCopyJSONValue(want["spec"])
		vm.SetLabels(merged(vm.GetLabels(), wantVM.GetLabels()))
		vm.SetAnnotations(merged(vm.GetAnnotations(), wantVM.GetAnnotations()))
		return true
	})
}

func merged(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}

// deleteVM deletes a VM and, unless keep, the DataVolumes it owns among volumes; with keep,
// those DataVolumes are first released and marked as kept for the VM's name.
func (r *Reconciler) deleteVM(ctx context.Context, pool, vm *unstructured.Unstructured, volumes []string, keep bool) error {
	if vm == nil {
		return nil
	}
	for _, name := range volumes {
		key := types.NamespacedName{Namespace: vm.GetNamespace(), Name: name}
		var err error
		if keep {
			err = r.update(ctx, GVKDataVolume, key, "", func(dv *unstructured.Unstructured) bool {
				if dv.GetLabels()[LabelPreserved] != "" || !ownedBy(dv, vm.GetUID()) {
					return false // kept already, or not this VM's
				}
				dv.SetOwnerReferences(slices.DeleteFunc(dv.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return o.UID == vm.GetUID() }))
				dv.SetLabels(merged(dv.GetLabels(), map[string]string{LabelPreserved: pool.GetName()}))
				dv.SetAnnotations(merged(dv.GetAnnotations(), map[string]string{
					AnnotationPreservedPool: string(pool.GetUID()), AnnotationPreservedVM: vm.GetName(),
				}))
				return true
			})
		} else {
			err = r.deleteOwnedVolume(ctx, key, vm.GetUID())
		}
		if err != nil {
			return fmt.Errorf("VirtualMachine %s/%s: DataVolume %s: %w", vm.GetNamespace(), vm.GetName(), name, err)
		}
	}
	uid := vm.GetUID()
	err := r.Client.Delete(ctx, vm, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err = client.IgnoreNotFound(err); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete VirtualMachine %s/%s: %w", vm.GetNamespace(), vm.GetName(), err)
	}
	return nil
}

func (r *Reconciler) deleteOwnedVolume(ctx context.Context, key types.NamespacedName, owner types.UID) error {
	dv := kinds.NewObject(GVKDataVolume)
	if err := r.APIReader.Get(ctx, key, dv); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !ownedBy(dv, owner) {
		return nil // not this VM's: never delete what the pool does not own
	}
	uid := dv.GetUID()
	return client.IgnoreNotFound(r.Client.Delete(ctx, dv, client.Preconditions{UID: &uid}))
}

func ownedBy(obj client.Object, uid types.UID) bool {
	return slices.ContainsFunc(obj.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return o.UID == uid })
}

// reclaim gives a kept DataVolume back to its VM: owned by it again, no longer marked kept.
func (r *Reconciler) reclaim(ctx context.Context, pool *unstructured.Unstructured, rc engine.PoolReclaim, vm *unstructured.Unstructured) error {
	if vm == nil {
		return nil
	}
	key := types.NamespacedName{Namespace: pool.GetNamespace(), Name: rc.Volume}
	err := r.update(ctx, GVKDataVolume, key, "", func(dv *unstructured.Unstructured) bool {
		if dv.GetAnnotations()[AnnotationPreservedPool] != string(pool.GetUID()) {
			return false
		}
		yes := true
		refs := slices.DeleteFunc(dv.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return o.UID == vm.GetUID() })
		dv.SetOwnerReferences(append(refs, metav1.OwnerReference{
			APIVersion: GVKVirtualMachine.GroupVersion().String(), Kind: GVKVirtualMachine.Kind,
			Name: vm.GetName(), UID: vm.GetUID(), Controller: &yes, BlockOwnerDeletion: &yes,
		}))
		labels, annotations := dv.GetLabels(), dv.GetAnnotations()
		delete(labels, LabelPreserved)
		delete(annotations, AnnotationPreservedPool)
		delete(annotations, AnnotationPreservedVM)
		dv.SetLabels(labels)
		dv.SetAnnotations(annotations)
		return true
	})
	if err != nil {
		return fmt.Errorf("give DataVolume %s back to VirtualMachine %s: %w", key, rc.VM, err)
	}
	r.Recorder.Eventf(vm, corev1.EventTypeNormal, ReasonReclaimed, "Pool %s gave the kept DataVolume %s back to VirtualMachine %s", pool.GetName(), rc.Volume, rc.VM)
	return nil
}

// update reads key from the API server, lets mutate change it and writes it, again on
// conflicts. A missing object, or one whose UID is not uid (when given), is left alone.
func (r *Reconciler) update(ctx context.Context, gvk schema.GroupVersionKind, key types.NamespacedName, uid types.UID, mutate func(*unstructured.Unstructured) bool) error {
	return r.write(ctx, gvk, key, uid, false, mutate)
}

// write is update, of the status subresource when status is set.
func (r *Reconciler) write(ctx context.Context, gvk schema.GroupVersionKind, key types.NamespacedName, uid types.UID, status bool, mutate func(*unstructured.Unstructured) bool) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		obj := kinds.NewObject(gvk)
		if err := r.APIReader.Get(ctx, key, obj); err != nil {
			return client.IgnoreNotFound(err)
		}
		if uid != "" && obj.GetUID() != uid {
			return nil
		}
		if !mutate(obj) {
			return nil
		}
		if status {
			return client.IgnoreNotFound(r.Client.Status().Update(ctx, obj, client.FieldOwner(FieldManager)))
		}
		return client.IgnoreNotFound(r.Client.Update(ctx, obj, client.FieldOwner(FieldManager)))
	})
}

// writeStatus writes the plan's counts, conditions and autohealing records, and the
// generation they describe; a failed apply turns Ready's reason into the error. A status the
// cached pool already has is not written (nor read again).
func (r *Reconciler) writeStatus(ctx context.Context, cached *unstructured.Unstructured, plan *engine.PoolPlan, applyErr error) error {
	generation := cached.GetGeneration()
	desired := func(pool *unstructured.Unstructured) (map[string]any, bool) {
		status := poolv1alpha1.VirtualMachinePoolStatus{
			Replicas:           plan.Status.Replicas,
			ReadyReplicas:      plan.Status.ReadyReplicas,
			UpdatedReplicas:    plan.Status.UpdatedReplicas,
			ObservedGeneration: generation,
			LabelSelector:      plan.Status.LabelSelector,
		}
		for _, rec := range plan.Reprovisions {
			status.Reprovisions = append(status.Reprovisions, poolv1alpha1.Reprovision{Name: rec.Name, Count: rec.Count, LastTime: metav1.NewTime(rec.LastTime)})
		}
		var old poolv1alpha1.VirtualMachinePoolStatus
		if raw, ok := pool.Object["status"].(map[string]any); ok {
			_ = runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &old)
		}
		status.Conditions = old.Conditions
		for _, c := range plan.Conditions {
			meta.SetStatusCondition(&status.Conditions, metav1.Condition{
				Type: c.Type, Status: metav1.ConditionStatus(c.Status), Reason: c.Reason, Message: c.Message, ObservedGeneration: generation,
			})
		}
		if applyErr != nil {
			meta.SetStatusCondition(&status.Conditions, metav1.Condition{
				Type: "Ready", Status: metav1.ConditionFalse, Reason: ReasonFailed, Message: applyErr.Error(), ObservedGeneration: generation,
			})
		}
		raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
		if err != nil {
			return nil, false
		}
		return raw, !equalJSON(pool.Object["status"], raw)
	}
	if _, changed := desired(cached); !changed {
		return nil
	}
	return r.write(ctx, GVKPool, client.ObjectKeyFromObject(cached), "", true, func(pool *unstructured.Unstructured) bool {
		raw, changed := desired(pool)
		if changed {
			pool.Object["status"] = raw
		}
		return changed
	})
}

func equalJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// slowStart runs do(0..n-1) in batches of 1, 2, 4, ... at most maxCreatesInFlight at a time,
// in order, and stops after a batch in which one failed (as Kubernetes' ReplicaSet controller
// creates pods): a pool scaling out by hundreds creates them in parallel, while a create that
// cannot succeed (quota, a webhook refusing the template) is tried a few times, not n.
// It returns every failure of the batches it ran.
func slowStart(n int, do func(i int) error) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	for start, size := 0, 1; start < n; start, size = start+size, min(2*size, maxCreatesInFlight) {
		end := min(start+size, n)
		var wg sync.WaitGroup
		for i := start; i < end; i++ {
			wg.Go(func() {
				if err := do(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			break
		}
	}
	return errors.Join(errs...)
}

// maxCreatesInFlight bounds the VirtualMachine creates of one plan running at once.
const maxCreatesInFlight = 16

// indexPoolName indexes VirtualMachines by the pools that may hold them (poolNamesOfVM).
const indexPoolName = "pool.virt-rules.io/pool-name"

// poolNamesOfVM is every pool name a VM may belong to: its controlling pool's, and each
// prefix of its name that ends before a "-" (a pool's VMs are named <pool>-<n>, and a VM
// detached from its pool keeps its name). gather then keeps those the pool owns or names.
func poolNamesOfVM(obj client.Object) []string {
	var names []string
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil && ref.Kind == poolv1alpha1.Kind {
		names = append(names, ref.Name)
	}
	name := obj.GetName()
	for i := strings.IndexByte(name, '-'); i > 0; {
		if !slices.Contains(names, name[:i]) {
			names = append(names, name[:i])
		}
		j := strings.IndexByte(name[i+1:], '-')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return names
}
