// Package controllers wires every virt-rules controller into a controller-runtime manager.
// The `virt-rules controller` command and the integration tests call the same Setup, so what
// is tested is what runs.
package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	vmdefaults "github.com/virt-rules/virt-rules/controllers/defaults"
	"github.com/virt-rules/virt-rules/controllers/kinds"
	"github.com/virt-rules/virt-rules/controllers/migrationpolicy"
	"github.com/virt-rules/virt-rules/controllers/migrationtarget"
	"github.com/virt-rules/virt-rules/controllers/nodelabeller"
	"github.com/virt-rules/virt-rules/controllers/pool"
	"github.com/virt-rules/virt-rules/controllers/reports"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// ManagerOptions completes o for these controllers: they read KubeVirt's kinds as
// unstructured objects, which controller-runtime's client only serves from the informer cache
// (and its field indexes) when told to; otherwise every read would go to the API server.
func ManagerOptions(o ctrl.Options) ctrl.Options {
	if o.Client.Cache == nil {
		o.Client.Cache = &client.CacheOptions{}
	}
	// VMIs are the exception: controllers watch and read them through the cache as metadata
	// only (kinds.NewMetadata), and read a whole VMI from the API server (mgr.GetAPIReader())
	// or, for pools, pool.NewVMICache. A Get or List of an unstructured VMI through the
	// manager's client would start an informer of whole VMIs, most of the memory at 10,000.
	o.Client.Cache.Unstructured = true
	if o.Cache.DefaultTransform == nil {
		// No controller reads managedFields, often the largest part of a stored object; at
		// 10,000 VMIs and 5,000 nodes keeping them would cost hundreds of MiB. Unstructured
		// objects (VMs, pools, policies) share their keys and short strings (kinds.Compact).
		o.Cache.DefaultTransform = kinds.CacheTransform
	}
	// Nodes keep what the node decisions read (TrimNode): at 5,000 nodes their status is
	// most of the typed cache.
	if o.Cache.ByObject == nil {
		o.Cache.ByObject = map[client.Object]cache.ByObject{}
	}
	hasNode := false
	for obj := range o.Cache.ByObject {
		_, isNode := obj.(*corev1.Node)
		hasNode = hasNode || isNode
	}
	if !hasNode {
		o.Cache.ByObject[&corev1.Node{}] = cache.ByObject{Transform: TrimNode}
	}
	return o
}

// ScopePools makes the pool controller see, and so write, only the VirtualMachinePools, VMs
// and DataVolumes of namespaces (none: every namespace): the manager's cache watches those
// kinds there only, so the controller's service account needs their RBAC there only (a
// RoleBinding per namespace, examples/deploy/pool-namespaces). The other controllers' kinds
// stay cluster-wide.
func ScopePools(o ctrl.Options, namespaces []string) ctrl.Options {
	if len(namespaces) == 0 {
		return o
	}
	in := map[string]cache.Config{}
	for _, ns := range namespaces {
		in[ns] = cache.Config{}
	}
	if o.Cache.ByObject == nil {
		o.Cache.ByObject = map[client.Object]cache.ByObject{}
	}
	for _, gvk := range []schema.GroupVersionKind{pool.GVKPool, pool.GVKVirtualMachine, pool.GVKDataVolume} {
		o.Cache.ByObject[kinds.NewObject(gvk)] = cache.ByObject{Namespaces: in}
	}
	return o
}

// Options tune the controllers.
type Options struct {
	// ConcurrentSyncs is how many objects each controller reconciles in parallel.
	ConcurrentSyncs int
	// NodeLabelWorkers is how many node labels the node labeller writes in parallel (0: as
	// many as ConcurrentSyncs).
	NodeLabelWorkers int
	// MigrationPolicyWorkers is how many VMIs the migrationpolicy controller decides and
	// annotates in parallel (0: as many as ConcurrentSyncs). Each annotation write passes
	// KubeVirt's VMI webhooks, so it is the write, not the decision, that takes the time.
	MigrationPolicyWorkers int
	// PoolNamespaces are the namespaces of ScopePools (none: every namespace): the pool
	// controller's own VMI cache (pool.NewVMICache) watches VMIs there only.
	PoolNamespaces []string
	// PoolBurstLimit caps the VMs one pass of the pool controller creates or updates;
	// 0 is engine.DefaultPoolBurstLimit.
	PoolBurstLimit int
	// PoolPlanInterval is the least time between two plans of a pool that updates of its VMs
	// and VMIs ask for; 0 is pool.DefaultPlanInterval, a negative one plans on every update.
	PoolPlanInterval time.Duration
	// Webhooks registers the admission webhooks on the manager's webhook server, which then
	// needs serving certificates.
	Webhooks bool
	// DefaulterURL, with Webhooks, serves the mutating webhook that fills in VMs' and VMIs'
	// guest-visible defaults by calling the defaulter service at this URL.
	DefaulterURL string
	// DefaulterTimeout bounds one call to the defaulter service.
	DefaulterTimeout time.Duration
	// DefaulterCAFile holds the CA certificates the defaulter's serving certificate is checked
	// against ("": DefaulterRoots, or the system's).
	DefaulterCAFile string
	// DefaulterRoots, when set, gives them instead, as they change (the CA virt-rules issued
	// the defaulter's certificate with, read from its Secret: internal/webhookcerts).
	DefaulterRoots vmdefaults.Roots
	// DefaulterTokenFile holds the service account token sent to the defaulter (a projected
	// token for its audience), re-read as it rotates; "": none.
	DefaulterTokenFile string
	// Shadow, when set, has the migrationpolicy, migrationtarget, nodelabeller and pool
	// controllers ask a candidate bundle each decision too, never acting on it, and the
	// reports show where it differs; with Webhooks, the webhooks (but the defaults webhook,
	// whose defaulter service has a candidate of its own) ask it each answer too, after
	// answering.
	Shadow *shadow.Shadow
}

// Setup registers every controller with mgr, all asking eng.
func Setup(ctx context.Context, mgr ctrl.Manager, eng *engine.Engine, o Options) error {
	if o.Shadow != nil {
		if err := mgr.Add(o.Shadow); err != nil {
			return fmt.Errorf("run the shadow rollout: %w", err)
		}
	}
	sets := &migrationpolicy.PolicySets{Client: mgr.GetClient(), Engine: eng}
	policy := &migrationpolicy.Reconciler{
		Client:                  mgr.GetClient(),
		Recorder:                mgr.GetEventRecorderFor(migrationpolicy.ControllerName),
		Sets:                    sets,
		MaxConcurrentReconciles: max(1, cmp.Or(o.MigrationPolicyWorkers, o.ConcurrentSyncs)),
	}
	var candidateSets *migrationpolicy.PolicySets
	if o.Shadow != nil {
		candidateSets = &migrationpolicy.PolicySets{Client: mgr.GetClient(), Engine: o.Shadow.Candidate()}
		policy.Shadow, policy.CandidateSets = o.Shadow, candidateSets
	}
	for _, s := range []*migrationpolicy.PolicySets{sets, candidateSets} {
		if s != nil {
			if err := s.Watch(ctx, mgr.GetCache()); err != nil {
				return err
			}
		}
	}
	if err := policy.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up %s controller: %w", migrationpolicy.ControllerName, err)
	}
	policies, err := migrationpolicy.WatchPolicies(ctx, mgr.GetCache(), eng.NewMigrationPolicyIndex())
	if err != nil {
		return fmt.Errorf("index MigrationPolicies by selector key: %w", err)
	}
	status := &migrationpolicy.StatusReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorderFor(migrationpolicy.StatusControllerName), Engine: eng, Policies: policies, Shadow: o.Shadow}
	if err := status.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("set up %s controller: %w", migrationpolicy.StatusControllerName, err)
	}
	labeller := &nodelabeller.Reconciler{Client: mgr.GetClient(), Nodes: eng.NewLevelNodes(), PatchWorkers: max(1, cmp.Or(o.NodeLabelWorkers, o.ConcurrentSyncs))}
	if o.Shadow != nil {
		labeller.Shadow, labeller.CandidateNodes = o.Shadow, o.Shadow.Candidate().NewLevelNodes()
	}
	if err := labeller.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up %s controller: %w", nodelabeller.ControllerName, err)
	}
	target := &migrationtarget.Reconciler{
		Client:                  mgr.GetClient(),
		PodReader:               mgr.GetAPIReader(),
		VMIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorderFor(migrationtarget.ControllerName),
		Engine:                  eng,
		Nodes:                   eng.NewNodes(),
		MaxConcurrentReconciles: o.ConcurrentSyncs,
	}
	if o.Shadow != nil {
		target.Shadow, target.CandidateNodes = o.Shadow, o.Shadow.Candidate().NewNodes()
	}
	if err := target.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up %s controller: %w", migrationtarget.ControllerName, err)
	}
	poolVMIs, err := pool.NewVMICache(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
	}, o.PoolNamespaces)
	if err != nil {
		return err
	}
	pools := &pool.Reconciler{
		VMIs:                    poolVMIs,
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorderFor(pool.ControllerName),
		Engine:                  eng,
		BurstLimit:              o.PoolBurstLimit,
		PlanInterval:            o.PoolPlanInterval,
		MaxConcurrentReconciles: o.ConcurrentSyncs,
		Shadow:                  o.Shadow,
	}
	if err := pools.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up %s controller: %w", pool.ControllerName, err)
	}
	if err := (&reports.Reconciler{Client: mgr.GetClient(), Shadow: o.Shadow, Engine: eng}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up %s controller: %w", reports.ControllerName, err)
	}
	if o.Webhooks {
		register := func(path string, h http.Handler) { mgr.GetWebhookServer().Register(path, timedWebhook(path, h)) }
		register(migrationpolicy.ValidatingWebhookPath, &webhook.Admission{
			Handler: &migrationpolicy.ValidatingWebhook{Client: mgr.GetClient(), Policies: policies, Engine: eng, Shadow: o.Shadow},
		})
		register(migrationpolicy.MigrationStateWebhookPath, &webhook.Admission{
			Handler: &migrationpolicy.MigrationStateWebhook{Client: mgr.GetClient(), Sets: sets, Shadow: o.Shadow, CandidateSets: candidateSets},
		})
		register(migrationtarget.ValidatingWebhookPath, &webhook.Admission{
			Handler: &migrationtarget.ValidatingWebhook{Engine: eng, Client: mgr.GetClient(), Shadow: o.Shadow},
		})
		register(migrationtarget.PodWebhookPath, &webhook.Admission{
			Handler: &migrationtarget.PodWebhook{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Engine: eng, Shadow: o.Shadow},
		})
		register(nodelabeller.SchedulingWebhookPath, &webhook.Admission{
			Handler: &nodelabeller.SchedulingWebhook{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), VMIs: poolVMIs, Whole: pool.Whole, Engine: eng, Shadow: o.Shadow},
		})
		if o.DefaulterURL != "" {
			roots := o.DefaulterRoots
			if o.DefaulterCAFile != "" {
				if roots != nil {
					return errors.New("set up the defaults webhook: the defaulter's CAs from a file and as they change: give one")
				}
				var err error
				if roots, err = vmdefaults.FileRoots(o.DefaulterCAFile); err != nil {
					return fmt.Errorf("set up the defaults webhook: %w", err)
				}
			}
			hc, err := vmdefaults.NewHTTPClient(o.DefaulterURL, roots, o.DefaulterTokenFile)
			if err != nil {
				return fmt.Errorf("set up the defaults webhook: %w", err)
			}
			w := &vmdefaults.MutatingWebhook{URL: o.DefaulterURL, Timeout: o.DefaulterTimeout, Client: mgr.GetClient(), HTTPClient: hc}
			register(vmdefaults.MutatingWebhookPath, w.Handler())
		}
	}
	return nil
}
