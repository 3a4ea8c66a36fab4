package testcluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotationFailStart on a VMI (or a VM template) makes the stand-in fail its start.
const AnnotationFailStart = "testcluster.virt-rules.io/fail-start"

// AnnotationHoldMigration on a VMI (or a VM template) makes the stand-in leave its migrations
// before the target is prepared, as a virt-handler whose target never answers: virt-controller's
// target pod stays bound and the source pod Running, so a test can judge the target pod against
// a cluster that stands still.
const AnnotationHoldMigration = "testcluster.virt-rules.io/hold-migration"

// AnnotationNotLiveMigratable on a VMI (or a VM template) makes the stand-in report its
// LiveMigratable condition False, with the annotation's value as the condition's reason (a
// real virt-handler's: DisksNotLiveMigratable, InterfaceNotLiveMigratable, ...): what virt-handler
// finds of a domain it runs, which the test cluster has none of.
const AnnotationNotLiveMigratable = "testcluster.virt-rules.io/not-live-migratable"

var vmiResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}

// StandIn is the virt-handler stand-in: the one KubeVirt piece the test cluster simulates, since
// there is no hypervisor. It acts as virt-handler's ServiceAccount, with virt-handler's RBAC
// (list, watch and update of VMIs: it PUTs whole objects), and writes what virt-handler writes:
//
//   - a VMI virt-controller has Scheduled onto a node: Running, with the conditions
//     LiveMigratable, StorageLiveMigratable and AgentConnected (Ready is virt-controller's, from
//     the launcher pod), selinuxContext "none",
//     migration method and transport, machine type (MachineType), interfaces, guest OS;
//   - a migration virt-controller has handed off (migrationState.targetNode set), one step per
//     write as the two virt-handlers would: target prepared (address and ports), started
//     (startTimestamp, PreCopy), completed (domain detected on the target, status.nodeName and
//     the kubevirt.io/nodeName label moved to the target);
//   - after a completed migration the source virt-launcher exits, so its pod is set Succeeded
//     (kubelet's part: done as the admin through pods/status, since kwok keeps pods Running);
//   - a VMI being deleted on a node: Succeeded (the domain stopped);
//   - a VMI annotated AnnotationFailStart: Failed instead of Running (its domain did not start),
//     so tests can show what KubeVirt and virt-rules do about VMs that fail to start;
//   - a VMI annotated AnnotationNotLiveMigratable: LiveMigratable False, with that reason.
type StandIn struct {
	vmis  dynamic.NamespaceableResourceInterface
	admin client.Client
	log   *slog.Logger
	now   func() time.Time
}

// standInWorkers is how many VMIs the stand-in works on at once.
const standInWorkers = 8

// standInQPS is the stand-in's client rate limit. It writes for every virt-handler of the
// cluster, each of which has a limit of its own (KubeVirt's default: 50 a second), so one
// node's budget must not be the whole cluster's, as client-go's default (5 a second, bursts of
// 10) would be. Envtest gives its own admin client the same 1,000.
const standInQPS = 1000

func (c *Cluster) startStandIn(handler *rest.Config) error {
	handler = rest.CopyConfig(handler)
	handler.QPS, handler.Burst = standInQPS, 2*standInQPS
	dyn, err := dynamic.NewForConfig(handler)
	if err != nil {
		return fmt.Errorf("virt-handler stand-in client: %w", err)
	}
	s := &StandIn{vmis: dyn.Resource(vmiResource), admin: c.Client, log: c.log.With("component", "virt-handler-stand-in"), now: time.Now}
	ctx, cancel := context.WithCancel(context.Background())
	c.StandIn, c.stopStand, c.standDone = s, cancel, make(chan struct{})
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	informer := factory.ForResource(vmiResource).Informer()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		cancel()
		return fmt.Errorf("virt-handler stand-in: %w", err)
	}
	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	// A real cluster has one virt-handler per node, each starting its own VMIs; the stand-in
	// plays them all, standInWorkers VMIs at a time (the queue never hands one VMI to two).
	// Each step is a VMI write through virt-api's webhooks: one at a time, thousands of pool
	// VMs would wait on the stand-in rather than on KubeVirt or virt-rules.
	var workers sync.WaitGroup
	for range standInWorkers {
		workers.Go(func() {
			for {
				key, quit := queue.Get()
				if quit {
					return
				}
				obj, exists, err := informer.GetStore().GetByKey(key)
				if err == nil && exists {
					err = s.sync(ctx, obj.(*unstructured.Unstructured))
				}
				if err != nil && ctx.Err() == nil {
					s.log.Info("retry", "vmi", key, "err", err)
					queue.AddRateLimited(key)
				} else {
					queue.Forget(key)
				}
				queue.Done(key)
			}
		})
	}
	go func() {
		defer close(c.standDone)
		workers.Wait()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		cancel()
		return fmt.Errorf("virt-handler stand-in: VMI informer did not sync")
	}
	return nil
}

// sync writes the next thing virt-handler would write for vmi, if any.
func (s *StandIn) sync(ctx context.Context, vmi *unstructured.Unstructured) error {
	if err := s.finishSourcePod(ctx, vmi); err != nil {
		return err
	}
	next, step := Step(vmi, s.now())
	if next == nil {
		return nil
	}
	if _, err := s.vmis.Namespace(vmi.GetNamespace()).Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	s.log.Info(step, "vmi", vmi.GetNamespace()+"/"+vmi.GetName())
	return nil
}

// Step is what virt-handler writes next on vmi at now: the whole new object and what it is,
// or nil when virt-handler would write nothing.
func Step(vmi *unstructured.Unstructured, now time.Time) (*unstructured.Unstructured, string) {
	ts := now.UTC().Format(time.RFC3339)
	v := vmi.DeepCopy()
	status, _ := v.Object["status"].(map[string]any)
	if status == nil {
		return nil, ""
	}
	phase, _ := status["phase"].(string)
	node, _ := status["nodeName"].(string)
	if v.GetDeletionTimestamp() != nil {
		if node == "" || phase == "Succeeded" || phase == "Failed" || phase == "" {
			return nil, ""
		}
		setPhase(status, "Succeeded", ts)
		return v, "domain stopped: Succeeded"
	}
	if phase == "Scheduled" && node != "" && v.GetAnnotations()[AnnotationFailStart] == "true" {
		setPhase(status, "Failed", ts)
		return v, "domain failed to start on " + node + ": Failed"
	}
	if phase == "Scheduled" && node != "" {
		setPhase(status, "Running", ts)
		status["selinuxContext"] = "none"
		status["migrationMethod"] = "LiveMigration"
		status["migrationTransport"] = "Unix"
		status["machine"] = map[string]any{"type": MachineType}
		status["guestOSInfo"] = map[string]any{"id": "fedora", "name": "Fedora Linux", "version": "42"}
		var ifaces []any
		list, _, _ := unstructured.NestedSlice(v.Object, "spec", "domain", "devices", "interfaces")
		for i, iface := range list {
			name, _, _ := unstructured.NestedString(iface.(map[string]any), "name")
			ip := fmt.Sprintf("10.244.0.%d", 10+i)
			ifaces = append(ifaces, map[string]any{
				"name": name, "infoSource": "domain, guest-agent", "ipAddress": ip, "ipAddresses": []any{ip},
				"mac": fmt.Sprintf("52:54:00:00:00:%02x", i+1), "queueCount": int64(1),
			})
		}
		status["interfaces"] = ifaces
		// Ready is virt-controller's: it follows the launcher pod's readiness once the VMI runs.
		conditions, _ := status["conditions"].([]any)
		kept := []any{}
		set := map[string]bool{"LiveMigratable": true, "StorageLiveMigratable": true, "AgentConnected": true}
		for _, c := range conditions {
			if t, _ := c.(map[string]any)["type"].(string); !set[t] {
				kept = append(kept, c)
			}
		}
		for _, t := range []string{"LiveMigratable", "StorageLiveMigratable", "AgentConnected"} {
			c := map[string]any{"type": t, "status": "True", "lastProbeTime": nil, "lastTransitionTime": ts}
			if reason := v.GetAnnotations()[AnnotationNotLiveMigratable]; t == "LiveMigratable" && reason != "" {
				c["status"], c["reason"] = "False", reason
				c["message"] = "set by the test cluster's virt-handler stand-in (" + AnnotationNotLiveMigratable + ")"
			}
			kept = append(kept, c)
		}
		status["conditions"] = kept
		return v, "domain started on " + node + ": Running"
	}
	m, _ := status["migrationState"].(map[string]any)
	target, _ := m["targetNode"].(string)
	if m == nil || target == "" || m["completed"] == true || m["failed"] == true || v.GetAnnotations()[AnnotationHoldMigration] == "true" {
		return nil, ""
	}
	switch {
	case m["targetNodeAddress"] == nil || m["targetNodeAddress"] == "":
		m["targetNodeAddress"] = "10.1.0.2"
		m["targetDirectMigrationNodePorts"] = map[string]any{"49152": int64(0), "49153": int64(49152)}
		return v, "migration target prepared on " + target
	case m["startTimestamp"] == nil:
		m["startTimestamp"] = ts
		m["mode"] = "PreCopy"
		return v, "migration to " + target + " started"
	default:
		m["targetNodeDomainDetected"] = true
		m["targetNodeDomainReadyTimestamp"] = ts
		m["completed"] = true
		m["endTimestamp"] = ts
		status["nodeName"] = target
		labels := v.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels["kubevirt.io/nodeName"] = target
		delete(labels, "kubevirt.io/migrationTargetNodeName")
		v.SetLabels(labels)
		return v, "migration to " + target + " completed"
	}
}

// setPhase sets the VMI's phase and, as virt-handler does, records when it entered it
// (status.phaseTransitionTimestamps, once per phase): KubeVirt's VM controller reads them, and
// takes a VMI that stopped without ever having been Running for a start failure to back off.
func setPhase(status map[string]any, phase, ts string) {
	status["phase"] = phase
	stamps, _ := status["phaseTransitionTimestamps"].([]any)
	for _, s := range stamps {
		if m, _ := s.(map[string]any); m["phase"] == phase {
			return
		}
	}
	status["phaseTransitionTimestamps"] = append(stamps, map[string]any{"phase": phase, "phaseTransitionTimestamp": ts})
}

// finishSourcePod sets the source virt-launcher pod of vmi's completed migration Succeeded.
func (s *StandIn) finishSourcePod(ctx context.Context, vmi *unstructured.Unstructured) error {
	m, _, _ := unstructured.NestedMap(vmi.Object, "status", "migrationState")
	name, _ := m["sourcePod"].(string)
	if m["completed"] != true || m["failed"] == true || name == "" {
		return nil
	}
	var pod corev1.Pod
	if err := s.admin.Get(ctx, types.NamespacedName{Namespace: vmi.GetNamespace(), Name: name}, &pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pod.Status.Phase != corev1.PodRunning {
		return nil
	}
	now := metav1.NewTime(s.now())
	pod.Status.Phase = corev1.PodSucceeded
	for i, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
			pod.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	for i, cs := range pod.Status.ContainerStatuses {
		var started metav1.Time
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		pod.Status.ContainerStatuses[i].Ready = false
		pod.Status.ContainerStatuses[i].Started = new(bool)
		pod.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: started, FinishedAt: now}}
	}
	if err := s.admin.Status().Update(ctx, &pod); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("source pod %s Succeeded: %w", name, err)
	}
	s.log.Info("source virt-launcher pod Succeeded after migration", "pod", vmi.GetNamespace()+"/"+name)
	return nil
}
