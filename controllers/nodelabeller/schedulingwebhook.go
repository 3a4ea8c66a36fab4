package nodelabeller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/launcher"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// SchedulingWebhookPath serves the mutation of virt-launcher pods at a VMI's first scheduling.
const SchedulingWebhookPath = "/mutate-v1-pod-schedulingaffinity"

// vmiReadDuration is how long the scheduling webhook took to read a launcher pod's VMI, by
// where it found it: the pool controller's cache, or the API server (a VMI the cache does not
// hold whole, or has not seen yet). An operator whose webhook p99 climbs looks here first.
var vmiReadDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "virtrules_webhook_vmi_read_duration_seconds",
	Help:    "Time an admission webhook took to read the VirtualMachineInstance it decides for, by webhook path and source (cache or apiserver).",
	Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
}, []string{"webhook", "source"})

func init() {
	metrics.Registry.MustRegister(vmiReadDuration)
}

// SchedulingAffinityDecider is what the scheduling webhook needs of the engine.
type SchedulingAffinityDecider interface {
	SchedulingAffinity(ctx context.Context, vmi, kubevirt *unstructured.Unstructured) (*corev1.NodeAffinity, error)
}

// SchedulingWebhook injects the migratability affinity the KubeVirt CR asks for
// (requireHostModelMigratabilityLevel, preferedHostModelMigratabilityLevel) into the
// virt-launcher pod of a host-model VMI at its first scheduling (design 002), so it starts on
// a node it can later migrate away from. The pod's own node affinity stands in for the VMI's,
// so what KubeVirt put on the pod is kept and the level terms are ANDed into it.
type SchedulingWebhook struct {
	// Client reads the KubeVirt CR from the informer cache; APIReader reads the VMI when VMIs
	// does not hold it whole.
	Client    client.Reader
	APIReader client.Reader
	// VMIs, when set, is a cache holding whole VMIs (the pool controller's: those a
	// VirtualMachine controls), asked before the API server; Whole tells a whole VMI from the
	// identity it keeps of others.
	VMIs   client.Reader
	Whole  func(*unstructured.Unstructured) bool
	Engine SchedulingAffinityDecider
	// Shadow, when set, is asked each affinity again with the candidate bundle, in the
	// background and never acted on.
	Shadow *shadow.Shadow
}

var _ admission.Handler = &SchedulingWebhook{}

// Handle mutates one CREATE of a virt-launcher pod.
func (w *SchedulingWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod, resp := launcher.Decode(req)
	if resp != nil {
		return *resp
	}
	if pod.Labels[launcher.LabelMigrationJobUID] != "" {
		return admission.Allowed("a migration target pod, not a first scheduling")
	}
	namespace := pod.Namespace
	owner := vmiOwner(pod)
	if owner == "" {
		return admission.Allowed("").WithWarnings("virt-rules: virt-launcher pod has no VirtualMachineInstance owner; left as created")
	}
	vmi, err := w.vmi(ctx, types.NamespacedName{Namespace: namespace, Name: owner})
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if vmi == nil {
		return admission.Allowed("").WithWarnings(fmt.Sprintf("virt-rules: VirtualMachineInstance %s/%s not found; pod left as created", namespace, owner))
	}
	kubevirt, err := w.kubevirt(ctx)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	// The decision reads the VMI; give it the pod's node affinity as the VMI's.
	var own any
	if podAffinity := launcher.NodeAffinity(pod); podAffinity != nil {
		if own, err = runtime.DefaultUnstructuredConverter.ToUnstructured(podAffinity); err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("convert pod node affinity: %w", err))
		}
	}
	if err := unstructured.SetNestedField(vmi.Object, own, "spec", "affinity", "nodeAffinity"); err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	affinity, err := w.Engine.SchedulingAffinity(ctx, vmi, kubevirt)
	var fe *engine.FieldError
	switch {
	case errors.As(err, &fe):
		// The CR's knob is invalid: the VMI still starts, and says why it got no affinity.
		w.compareCandidate(ctx, vmi, kubevirt, schedulingAnswerOf(nil, fe))
		return admission.Allowed("").WithWarnings(fmt.Sprintf("virt-rules: KubeVirt CR: %v; no migratability affinity added", err))
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	}
	w.compareCandidate(ctx, vmi, kubevirt, schedulingAnswerOf(affinity, nil))
	if affinity == nil {
		return admission.Allowed("no migratability affinity asked for")
	}
	return launcher.WithNodeAffinity(req, pod, affinity)
}

// schedulingAnswer is the webhook's answer as the shadow rollout compares it: the pod's node
// affinity (null: left as created), or why the KubeVirt CR's knob adds none.
type schedulingAnswer struct {
	NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity"`
	Invalid      string               `json:"invalid,omitempty"`
}

func schedulingAnswerOf(affinity *corev1.NodeAffinity, invalid error) schedulingAnswer {
	if invalid != nil {
		return schedulingAnswer{Invalid: invalid.Error()}
	}
	return schedulingAnswer{NodeAffinity: affinity}
}

// compareCandidate asks the candidate bundle the same affinity, in the background; nothing
// without a Shadow.
func (w *SchedulingWebhook) compareCandidate(ctx context.Context, vmi, kubevirt *unstructured.Unstructured, active schedulingAnswer) {
	if w.Shadow == nil {
		return
	}
	object := shadow.Object{Namespace: vmi.GetNamespace(), Name: vmi.GetName()}
	w.Shadow.CompareAnswer(ctx, shadow.DecisionSchedulingAffinity, object, active, func(ctx context.Context) (any, error) {
		affinity, err := w.Shadow.Candidate().SchedulingAffinity(ctx, vmi, kubevirt)
		var fe *engine.FieldError
		switch {
		case errors.As(err, &fe):
			return schedulingAnswerOf(nil, fe), nil
		case err != nil:
			return nil, fmt.Errorf("decide the scheduling affinity of VirtualMachineInstance %s: %w", object.Key(), err)
		}
		return schedulingAnswerOf(affinity, nil), nil
	})
}

// vmiOwner is the name of the VirtualMachineInstance controlling pod, or "".
func vmiOwner(pod *corev1.Pod) string {
	for _, ref := range pod.OwnerReferences {
		if ref.Kind == kinds.VirtualMachineInstance.Kind && ref.Controller != nil && *ref.Controller {
			return ref.Name
		}
	}
	return ""
}

func (w *SchedulingWebhook) vmi(ctx context.Context, key types.NamespacedName) (*unstructured.Unstructured, error) {
	// The manager's cache keeps VMIs as metadata only (controllers.ManagerOptions). A VM's VMI
	// is whole in the pool controller's cache once its watch has seen it (virt-controller
	// creates the pod after it saw the VMI, so mostly it has); otherwise the API server, one
	// GET, which on a busy API server is most of this webhook's time.
	start := time.Now()
	if w.VMIs != nil && w.Whole != nil {
		// Bounded: before the cache has synced (a replica starting), a Get waits for it.
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		cached := kinds.NewObject(kinds.VirtualMachineInstance)
		err := w.VMIs.Get(cctx, key, cached)
		cancel()
		if err == nil && w.Whole(cached) {
			vmiReadDuration.WithLabelValues(SchedulingWebhookPath, "cache").Observe(time.Since(start).Seconds())
			return cached, nil
		}
	}
	vmi := kinds.NewObject(kinds.VirtualMachineInstance)
	err := w.APIReader.Get(ctx, key, vmi)
	vmiReadDuration.WithLabelValues(SchedulingWebhookPath, "apiserver").Observe(time.Since(start).Seconds())
	if err == nil {
		return vmi, nil
	}
	if client.IgnoreNotFound(err) != nil {
		return nil, fmt.Errorf("get VirtualMachineInstance %s: %w", key, err)
	}
	return nil, nil
}

// kubevirt is the cluster's KubeVirt CR (the oldest, should there be several), or nil.
func (w *SchedulingWebhook) kubevirt(ctx context.Context) (*unstructured.Unstructured, error) {
	return kinds.ReadClusterKubeVirt(ctx, w.Client)
}
