package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/controllers/candidates"
	"github.com/virt-rules/virt-rules/controllers/pool"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/bundlestatus"
	"github.com/virt-rules/virt-rules/internal/delegatedauth"
	"github.com/virt-rules/virt-rules/internal/shadow"
)

// controllerOptions are the flags of `virt-rules controller`.
type controllerOptions struct {
	bundle             bundleFlags
	remoteBundle       remoteBundleFlags
	candidate          candidateBundleFlags
	decisionLog        decisionLogFlag
	bundlePoll         time.Duration
	kubeconfig         string
	metricsAddr        string
	probeAddr          string
	leaderElect        bool
	leaderElectionNS   string
	leaderElectionID   string
	leaseDuration      time.Duration
	renewDeadline      time.Duration
	retryPeriod        time.Duration
	logLevel           string
	maxConcurrentSyncs int
	nodeLabelWorkers   int
	policyWorkers      int
	webhookCertDir     string
	webhookPort        int
	pprofAddr          string
	kubeAPIQPS         float32
	kubeAPIBurst       int
	poolBurstLimit     int
	objectCache        int
	poolPlanInterval   time.Duration
	defaulterURL       string
	defaulterTimeout   time.Duration
	defaulterCAFile    string
	defaulterTokenFile string
	metricsInsecure    bool
	metricsCertDir     string
	poolNamespaces     []string
	webhookHost        string
	webhookCerts       webhookCertFlags
	defaulterCerts     defaulterCertFlags
}

func newControllerCommand() *cobra.Command {
	var o controllerOptions
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the in-cluster controllers that apply the decisions",
		Long: `controller runs the virt-rules controllers in one controller-runtime manager:

  migrationpolicy         annotates every VirtualMachineInstance with the MigrationPolicy it
                          obeys (migrations.virt-rules.io/policy) and its effective migration
                          configuration (migrations.virt-rules.io/configuration)
  migrationpolicy-status  counts each MigrationPolicy's VMIs and validates it
  migrationtarget         decides each new VirtualMachineInstanceMigration that adds a node
                          constraint: with no node to go to it is failed at once (phase
                          Failed, condition MigrationTargetAvailable with the reason code,
                          an Event); otherwise the condition lists the candidates
  nodelabeller            keeps kubevirt/host-model-migratability-level on every schedulable
                          node, updated incrementally as nodes come, go and change
  pool                    runs VirtualMachinePools (pool.virt-rules.io/v1alpha1): creates,
                          deletes, updates, restarts and re-provisions their VMs as the pool
                          plan decides

With --webhook-cert-dir the admission webhooks are served (examples/deploy/webhooks/ is their
configuration): invalid MigrationPolicies and migration terms are rejected; a VMI's migration
state gets the policy decision; a migration's target virt-launcher pod gets the added term
ANDed into its node affinity; a host-model VMI's first virt-launcher pod gets the
migratability affinity the KubeVirt CR asks for. With --webhook-cert-secret the controller
makes and rotates its own webhook CA and serving certificate in that Secret, serves it, and
writes the CA into the webhook configurations (--webhook-configurations); /readyz waits for it.
With --defaulter-url too, a mutating webhook fills in every guest-visible default of new VMs
and VMIs (examples/deploy/defaults/). With --defaulter-cert-secret the controller also makes and
rotates the defaulter's CA and serving certificate in that Secret (the defaulter serves it from
the Secret mounted in its pod) and trusts that CA, read from the Secret through the API server
and reloaded when it changes; /readyz waits for it.

Only the leader (a Lease) writes. /healthz and /readyz are served on --health-probe-bind-address,
Prometheus metrics on --metrics-bind-address over HTTPS (--metrics-cert-dir, or a self-signed
certificate) to callers the API server vouches for: a bearer token (TokenReview) whose user may
get the non-resource URL /metrics (SubjectAccessReview), else 401 or 403; the controller's
service account may create tokenreviews and subjectaccessreviews for that.
--metrics-insecure-http serves them over plain HTTP to anyone (local use only).

With --pool-namespaces the pool controller sees and writes VirtualMachinePools, their VMs and
DataVolumes (and restarts their VMIs) in those namespaces only, so its RBAC can be RoleBindings
there (examples/deploy/pool-namespaces).

The bundle is the embedded one, --bundle (a path, reloaded when it changes) or --bundle-url
(polled; the last good one is kept in --bundle-cache-dir or --bundle-cache-configmap). With --bundle-verification-key
an unsigned or tampered bundle is refused. Every bundle first decides representative inputs
shipped with the binary within --bundle-trial-timeout and --bundle-trial-memory-limit;
every decision runs within --decision-timeout and --decision-memory-limit, and a bundle
whose decisions break that --bundle-revert-errors times within --bundle-revert-window is
refused and the one before it restored; a new bundle from --bundle-url is persisted only
after serving one --bundle-revert-window within budget. A refused bundle never replaces the serving one;
virtrules_bundle_* and virtrules_decision_budget_exceeded_total metrics and an Event on the
Pod (POD_NAME, POD_NAMESPACE) tell what happened. /readyz fails until a bundle is active.

Shadow rollout: --candidate-bundle (a path, reloaded when it changes) or --candidate-bundle-url
(polled, verified with --candidate-bundle-verification-key, default --bundle-verification-key,
within the same bounds, trial and budgets as the active bundle) is asked every decision the
migrationpolicy, migrationtarget, nodelabeller and pool controllers make, and every answer the
webhooks give (once given), in the background, and never acted on. Differences are counted in
virtrules_candidate_decision_differences_total (and every comparison in
virtrules_candidate_decision_comparisons_total), logged, written to --decision-log as events
named candidate.<decision> with both sides, and the controllers' listed in the reports. The
candidate's activations and refusals are counted in virtrules_candidate_bundle_* and recorded
as Events (CandidateBundleActivated, CandidateBundleRefused) on the Pod. Promotion is never
automatic: point --bundle or --bundle-url at the candidate.

The metrics server also serves, to callers allowed to get the VMI (SubjectAccessReview),
GET /apis/virt-rules.io/v1alpha1/namespaces/NS/virtualmachineinstances/NAME/candidates:
where a VMI not migrating could migrate now, as eval --candidates decides it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runController(cmd.Context(), o) },
	}
	o.bundle.register(cmd)
	o.remoteBundle.register(cmd)
	o.candidate.register(cmd)
	o.decisionLog.register(cmd)
	f := cmd.Flags()
	f.DurationVar(&o.bundlePoll, "bundle-poll-interval", 10*time.Second, "how often to check --bundle for changes, or --bundle-url (whole seconds)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig `FILE` for running outside a cluster (default: in-cluster, or $KUBECONFIG)")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint (0 disables it)")
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	f.StringVar(&o.pprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof profiles, unauthenticated: for a person profiling, never exposed (default: off)")
	f.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader with a Lease so only one replica writes")
	f.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "namespace of the Lease (default: the pod's namespace)")
	f.StringVar(&o.leaderElectionID, "leader-election-id", "virt-rules.kubevirt.io", "name of the Lease")
	f.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long a Lease holds without renewal")
	f.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader retries renewing before giving up")
	f.DurationVar(&o.retryPeriod, "leader-election-retry-period", 2*time.Second, "how often candidates try to acquire the Lease")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.IntVar(&o.maxConcurrentSyncs, "concurrent-syncs", 4, "objects reconciled in parallel by each controller (VMIs decided, pools planned)")
	f.IntVar(&o.nodeLabelWorkers, "node-label-workers", 16, "node level labels written in parallel (one node joining or leaving moves most levels)")
	f.IntVar(&o.policyWorkers, "migration-policy-workers", 16, "VMIs decided and annotated in parallel by the migrationpolicy controller (each annotation write passes KubeVirt's VMI webhooks)")
	f.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "`DIR` with tls.crt and tls.key for the admission webhooks; webhooks are served only when set")
	f.IntVar(&o.webhookPort, "webhook-port", 9443, "port of the admission webhook server")
	// client-go's own default is 5 requests a second, which would take half an hour to
	// annotate 10,000 VMIs; the API server's priority and fairness is the better brake.
	f.Float32Var(&o.kubeAPIQPS, "kube-api-qps", -1, "client-side limit of API requests per second; -1: none, the API server's priority and fairness applies")
	f.IntVar(&o.kubeAPIBurst, "kube-api-burst", 0, "burst above --kube-api-qps when it is set")
	f.IntVar(&o.objectCache, "object-cache", defaultObjectCache, "objects a decision reads (a pool's VMs and VMIs) kept converted by UID and resourceVersion, at most about twice this many, so that planning an unchanged pool again converts nothing; 0: none")
	f.IntVar(&o.poolBurstLimit, "pool-burst-limit", engine.DefaultPoolBurstLimit, "VMs one pass of the pool controller creates or updates at most, per pool")
	f.DurationVar(&o.poolPlanInterval, "pool-plan-interval", pool.DefaultPlanInterval, "least time between two plans of one pool that updates of its VMs and VMIs ask for (an update after a quiet interval plans at once; pool changes, creates and deletes always do); 0: a plan on every update")
	f.StringVar(&o.defaulterURL, "defaulter-url", "", "`URL` of the defaulter service (virt-rules defaulter); with --webhook-cert-dir, a mutating webhook fills in new VMs' and VMIs' guest-visible defaults")
	f.DurationVar(&o.defaulterTimeout, "defaulter-timeout", 4*time.Second, "how long the defaults webhook waits for the defaulter service")
	f.StringVar(&o.defaulterCAFile, "defaulter-ca-file", "", "`FILE` with the CA certificates (PEM) the defaulter's serving certificate is checked against (default: the system's)")
	f.StringVar(&o.defaulterTokenFile, "defaulter-token-file", "", "`FILE` with the service account token sent to the defaulter (a projected token for its audience, re-read as it rotates; https only)")
	f.BoolVar(&o.metricsInsecure, "metrics-insecure-http", false, "serve /metrics over plain HTTP to anyone: for local use only, never in a cluster")
	f.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "`DIR` with tls.crt and tls.key for /metrics (default: a self-signed certificate)")
	f.StringVar(&o.webhookHost, "webhook-host", "", "address the admission webhook server listens on (default: every address)")
	o.webhookCerts.register(cmd)
	o.defaulterCerts.register(cmd)
	f.StringSliceVar(&o.poolNamespaces, "pool-namespaces", nil, "`NAMESPACE`s the pool controller watches and writes in (comma-separated; default: every namespace)")
	return cmd
}

func runController(ctx context.Context, o controllerOptions) error {
	logger, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.FromSlogHandler(logger.Handler()))
	ctx = logr.NewContext(ctx, ctrl.Log)

	status, err := bundlestatus.New(ctrlmetrics.Registry)
	if err != nil {
		return fmt.Errorf("register bundle metrics: %w", err)
	}
	decisionLog, decisionLogOpts, err := o.decisionLog.open(logger)
	if err != nil {
		return err
	}
	defer closeDecisionLog(decisionLog, logger)
	opts := append(o.bundle.options(), engine.WithLogger(logger), engine.WithBundleEvents(status.Observe), engine.WithBudgetEvents(status.ObserveBudget))
	remoteOpts, err := o.remoteBundle.options(o.bundlePoll, func() (*rest.Config, error) { return restConfig(o.kubeconfig) })
	if err != nil {
		return err
	}
	opts = append(append(opts, remoteOpts...), decisionLogOpts...)
	eng, err := engine.New(ctx, append(opts, engine.WithObjectCache(o.objectCache))...)
	if err != nil {
		return err
	}
	if err := registerObjectCacheMetrics(ctrlmetrics.Registry, eng); err != nil {
		return err
	}
	if o.bundle.path != "" {
		go eng.WatchBundle(ctx, o.bundle.path, o.bundlePoll, nil)
	}
	if o.remoteBundle.url != "" {
		go eng.PollBundle(ctx)
	}
	var dl engine.DecisionLogger
	if decisionLog != nil {
		dl = decisionLog
	}
	shadowed, err := o.candidate.shadow(ctx, eng, candidateBounds{bundle: o.bundle, remote: o.remoteBundle, poll: o.bundlePoll}, logger, dl, ctrlmetrics.Registry)
	if err != nil {
		return err
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst
	metrics := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: true, FilterProvider: metricsAuth(logger), CertDir: o.metricsCertDir}
	if o.metricsInsecure {
		if o.metricsCertDir != "" {
			return errors.New("--metrics-insecure-http: leave out --metrics-cert-dir, or drop --metrics-insecure-http")
		}
		metrics = metricsserver.Options{BindAddress: o.metricsAddr}
		if o.metricsAddr != "0" {
			logger.WarnContext(ctx, "--metrics-insecure-http: serving /metrics over plain HTTP to any caller. Local use only.", "address", o.metricsAddr)
		}
	}
	if o.defaulterURL != "" && strings.HasPrefix(o.defaulterURL, "http://") {
		logger.WarnContext(ctx, "--defaulter-url is plain HTTP: VMs and their defaults travel unencrypted to a defaulter that authenticates no caller. Local use only.", "url", o.defaulterURL)
	}
	for _, ns := range o.poolNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("--pool-namespaces: %q: %s", ns, strings.Join(errs, "; "))
		}
	}
	webhookServer := webhook.Options{Host: o.webhookHost, Port: o.webhookPort, CertDir: o.webhookCertDir}
	certs, err := o.webhookCerts.certs(o.webhookCertDir)
	if err != nil {
		return err
	}
	if certs != nil {
		webhookServer.TLSOpts = append(webhookServer.TLSOpts, certs.TLSOption)
	}
	defaulterCerts, err := o.defaulterCerts.certs(o.webhookCertDir, o.defaulterURL, o.defaulterCAFile)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, controllers.ScopePools(controllers.ManagerOptions(ctrl.Options{
		Scheme:                        newScheme(),
		Metrics:                       metrics,
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              o.leaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
		WebhookServer:                 webhook.NewServer(webhookServer),
	}), o.poolNamespaces))
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	var shadowRollout *shadow.Shadow
	if shadowed != nil {
		shadowRollout = shadowed.Shadow
	}
	if pod := bundlestatus.PodFromEnv(); pod != nil {
		status.RecordEventsOn(mgr.GetEventRecorderFor("virt-rules-bundle"), pod)
		if shadowed != nil {
			// The candidate's on the same Pod: its refusals are this replica's configuration
			// (--candidate-bundle-url) failing, as the active bundle's are.
			shadowed.status.RecordEventsOn(mgr.GetEventRecorderFor("virt-rules-candidate-bundle"), pod)
		}
	}
	if o.objectCache < 0 {
		return fmt.Errorf("--object-cache %d: want 0 (none) or more", o.objectCache)
	}
	if o.poolBurstLimit < 1 {
		return fmt.Errorf("--pool-burst-limit %d: want at least 1", o.poolBurstLimit)
	}
	if o.poolPlanInterval < 0 {
		return fmt.Errorf("--pool-plan-interval %s: want 0 or more", o.poolPlanInterval)
	}
	if o.nodeLabelWorkers < 1 {
		return fmt.Errorf("--node-label-workers %d: want at least 1", o.nodeLabelWorkers)
	}
	if o.policyWorkers < 1 {
		return fmt.Errorf("--migration-policy-workers %d: want at least 1", o.policyWorkers)
	}
	setup := controllers.Options{ConcurrentSyncs: o.maxConcurrentSyncs, NodeLabelWorkers: o.nodeLabelWorkers, MigrationPolicyWorkers: o.policyWorkers, PoolNamespaces: o.poolNamespaces, Webhooks: o.webhookCertDir != "", PoolBurstLimit: o.poolBurstLimit,
		PoolPlanInterval: planInterval(o.poolPlanInterval),
		DefaulterURL:     o.defaulterURL, DefaulterTimeout: o.defaulterTimeout, DefaulterCAFile: o.defaulterCAFile, DefaulterTokenFile: o.defaulterTokenFile,
		Shadow: shadowRollout}
	if defaulterCerts != nil {
		setup.DefaulterRoots = defaulterCerts.Roots
	}
	if err := controllers.Setup(ctx, mgr, eng, setup); err != nil {
		return err
	}
	if o.metricsAddr != "0" {
		h := &candidates.Handler{Client: mgr.GetClient(), PodReader: mgr.GetAPIReader(), VMIReader: mgr.GetAPIReader(), Engine: eng, Nodes: eng.NewNodes()}
		if err := mgr.AddMetricsServerExtraHandler(candidates.Pattern, h); err != nil {
			return fmt.Errorf("serve %s: %w", candidates.Pattern, err)
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("bundle", bundleReady(eng)); err != nil {
		return err
	}
	if certs != nil {
		if err := certs.AddTo(mgr); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("webhook-certificate", func(*http.Request) error { return certs.Ready() }); err != nil {
			return err
		}
	}
	// The defaulter's certificate: issued and renewed by every replica, as the webhook's (the
	// Secret's resourceVersion decides which replica's is kept), so that a replica starting
	// while no leader holds the Lease, or after the leader is gone, still gets it and trusts
	// the CA; a replica is ready once it trusts the CA its defaults webhook calls with.
	if defaulterCerts != nil {
		if err := defaulterCerts.AddTo(mgr); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("defaulter-certificate", func(*http.Request) error { return defaulterCerts.Ready() }); err != nil {
			return err
		}
	}
	logger.InfoContext(ctx, "starting controller", "bundleRevision", eng.Revision(), "bundleSource", eng.Source())
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

func bundleReady(eng *engine.Engine) healthz.Checker {
	return func(*http.Request) error {
		if eng.Revision() == "" {
			return errors.New("no bundle active")
		}
		return nil
	}
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	return s
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("find cluster config (use --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %s: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// metricsAuth guards /metrics as an API server delegates it (internal/delegatedauth): a
// token the API server vouches for (TokenReview) of a caller allowed get on /metrics
// (SubjectAccessReview). Unlike controller-runtime's filters.WithAuthenticationAndAuthorization,
// a malformed or rejected token is a 401, not a 500; refusals are counted by
// virtrules_metrics_denied_requests_total{reason}.
func metricsAuth(logger *slog.Logger) func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	return func(cfg *rest.Config, _ *http.Client) (metricsserver.Filter, error) {
		auth, err := delegatedauth.New(cfg, delegatedauth.Options{
			Realm: "virt-rules-metrics", Metric: "virtrules_metrics_denied_requests_total", Log: logger.With("server", "metrics"),
			Resource: candidates.Attributes,
		})
		if err != nil {
			return nil, fmt.Errorf("metrics authentication: %w", err)
		}
		if err := ctrlmetrics.Registry.Register(auth.Collector()); err != nil {
			return nil, fmt.Errorf("metrics authentication: %w", err)
		}
		return func(_ logr.Logger, h http.Handler) (http.Handler, error) { return auth.Wrap(h), nil }, nil
	}
}

// planInterval is --pool-plan-interval as controllers.Options reads it: there 0 is the
// default, and no pacing is negative.
func planInterval(flag time.Duration) time.Duration {
	if flag == 0 {
		return -1
	}
	return flag
}

// defaultObjectCache is --object-cache's default: every VM and VMI of 10,000-VM pools.
const defaultObjectCache = 20000

// registerObjectCacheMetrics counts the lookups of the engine's object cache
// (--object-cache): a falling share of hits says the cache is too small for the pools.
func registerObjectCacheMetrics(reg prometheus.Registerer, eng *engine.Engine) error {
	hits := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "virtrules_object_cache_hits_total",
		Help: "Objects a decision read that the engine had converted before (--object-cache).",
	}, func() float64 { return float64(eng.ObjectCacheStats().Hits) })
	misses := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "virtrules_object_cache_misses_total",
		Help: "Objects a decision read that the engine converted: new, changed, or no longer kept (--object-cache).",
	}, func() float64 { return float64(eng.ObjectCacheStats().Misses) })
	for _, c := range []prometheus.Collector{hits, misses} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register the object cache's metrics: %w", err)
		}
	}
	return nil
}
