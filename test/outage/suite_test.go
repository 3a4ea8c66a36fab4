// Package outage_test shows what a cluster does while virt-rules is down, on the test cluster
// of internal/testcluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
// nodes, KubeVirt's own virt-controller and virt-api, the virt-handler stand-in) with every
// webhook configuration virt-rules ships installed and pointing at a webhook server that runs
// only when a spec starts it: VMs are created and started, and migrations that add nothing
// run, with virt-rules stopped; a migration carrying a node constraint only virt-rules
// enforces fails closed, at its creation or at its target pod's, with the webhook's name in
// the message, and proceeds once virt-rules is back.
//
// The binaries come from KUBEBUILDER_ASSETS and KUBEVIRT_ASSETS; unset, the suite runs
// hack/control-plane.sh and hack/kubevirt.sh.
package outage_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/testcluster"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

var (
	cluster  *testcluster.Cluster
	k8s      client.Client
	ctx      context.Context
	cancel   context.CancelFunc
	repoRoot string
	logger   *slog.Logger
	webhooks *envtest.WebhookInstallOptions
	// running is virt-rules while it runs, nil while it is down.
	running *testcluster.VirtRules
)

// nodes are the suite's nodes: three alike, so any VM fits on any of them.
var nodes = []string{"node-1", "node-2", "node-3"}

func TestOutage(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "a cluster while virt-rules is down")
}

var _ = BeforeSuite(func(sctx SpecContext) {
	SetDefaultEventuallyTimeout(60 * time.Second)
	SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	repoRoot, err = filepath.Abs("../..")
	Expect(err).NotTo(HaveOccurred())
	logger = slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var ns []*corev1.Node
	for _, name := range nodes {
		ns = append(ns, testcluster.Node(name, testcluster.Skylake, nil))
	}
	cluster = clustersuite.Start(sctx, repoRoot, ns, logger)
	k8s = cluster.Client
	ctrl.SetLogger(logr.FromSlogHandler(logger.Handler()))

	By("installing every webhook configuration virt-rules ships, VM defaults included, as shipped")
	webhooks = &envtest.WebhookInstallOptions{Paths: []string{
		filepath.Join(repoRoot, "examples", "deploy", "webhooks"),
		filepath.Join(repoRoot, "examples", "deploy", "defaults", "mutating.yaml"),
	}}
	Expect(webhooks.Install(cluster.Config)).To(Succeed())
}, NodeTimeout(20*time.Minute))

var _ = AfterSuite(func() {
	if running != nil {
		Expect(running.Stop()).To(Succeed())
	}
	if cancel != nil {
		cancel()
	}
	if cluster != nil {
		Expect(cluster.Stop()).To(Succeed())
	}
})

var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })

// startVirtRules runs every virt-rules controller and webhook in this process, as
// `virt-rules controller` does, where the webhook configurations point.
func startVirtRules() {
	GinkgoHelper()
	Expect(running).To(BeNil(), "virt-rules already runs")
	eng, err := engine.New(ctx, engine.WithLogger(logger))
	Expect(err).NotTo(HaveOccurred())
	running, err = testcluster.RunVirtRules(ctx, cluster.Config, eng, testcluster.VirtRulesOptions{
		Controllers: controllers.Options{ConcurrentSyncs: 2},
		Webhooks:    webhooks,
	})
	Expect(err).NotTo(HaveOccurred())
}

// stopVirtRules stops virt-rules: its webhook server no longer answers.
func stopVirtRules() {
	GinkgoHelper()
	Expect(running).NotTo(BeNil(), "virt-rules is not running")
	Expect(running.Stop()).To(Succeed())
	running = nil
}

// create creates the object written as YAML in ns, as a user would, and returns the error.
func create(ns, doc string, args ...any) (*unstructured.Unstructured, error) {
	GinkgoHelper()
	obj := clustersuite.FromYAML(fmt.Sprintf(doc, args...))
	obj.SetNamespace(ns)
	return obj, k8s.Create(ctx, obj)
}
