package testcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/engine"
)

// VirtRulesOptions say how RunVirtRules runs virt-rules.
type VirtRulesOptions struct {
	// Controllers are controllers.Setup's options; Webhooks is set from Webhooks below.
	Controllers controllers.Options
	// Webhooks, when set, serves the admission webhooks where the API server was told to send
	// them when the caller installed these (envtest's local host, port and certificates).
	Webhooks *envtest.WebhookInstallOptions
	// LeaseNamespace, when set, runs with leader election, a Lease in this namespace and
	// lease times of seconds.
	LeaseNamespace string
}

// VirtRules is virt-rules running in this process.
type VirtRules struct {
	// Elected is closed once this instance leads (at once without leader election).
	Elected <-chan struct{}
	cancel  context.CancelFunc
	done    chan error
}

// RunVirtRules runs every virt-rules controller (and, with o.Webhooks, webhook) in this
// process against the API server of cfg, as `virt-rules controller` does: controllers.Setup,
// all asking eng. With webhooks it returns once their server answers. A process may run it
// again after Stop (the controllers' names are not checked for uniqueness).
func RunVirtRules(ctx context.Context, cfg *rest.Config, eng *engine.Engine, o VirtRulesOptions) (*VirtRules, error) {
	opts := ctrl.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if o.LeaseNamespace != "" {
		lease, renew, retry := 2*time.Second, 1500*time.Millisecond, 200*time.Millisecond
		opts.LeaderElection, opts.LeaderElectionID, opts.LeaderElectionNamespace = true, "virt-rules-test", o.LeaseNamespace
		opts.LeaderElectionReleaseOnCancel = true
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = &lease, &renew, &retry
	}
	if w := o.Webhooks; w != nil {
		opts.WebhookServer = webhook.NewServer(webhook.Options{Host: w.LocalServingHost, Port: w.LocalServingPort, CertDir: w.LocalServingCertDir})
	}
	mgr, err := ctrl.NewManager(cfg, controllers.ManagerOptions(opts))
	if err != nil {
		return nil, fmt.Errorf("virt-rules manager: %w", err)
	}
	mgrCtx, cancel := context.WithCancel(ctx)
	setup := o.Controllers
	setup.Webhooks = o.Webhooks != nil
	if err := controllers.Setup(mgrCtx, mgr, eng, setup); err != nil {
		cancel()
		return nil, fmt.Errorf("virt-rules controllers: %w", err)
	}
	v := &VirtRules{Elected: mgr.Elected(), cancel: cancel, done: make(chan error, 1)}
	go func() { v.done <- mgr.Start(mgrCtx) }()
	if o.Webhooks == nil {
		return v, nil
	}
	started := mgr.GetWebhookServer().StartedChecker()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		select {
		case err := <-v.done:
			v.done <- err
			return false, fmt.Errorf("virt-rules manager stopped: %w", err)
		default:
		}
		return started(nil) == nil, nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("virt-rules webhook server: %w", err), v.Stop())
	}
	return v, nil
}

// Stop ends virt-rules and returns what its manager's Start returned.
func (v *VirtRules) Stop() error {
	v.cancel()
	err := <-v.done
	v.done <- err // Stop may be called again
	return err
}
