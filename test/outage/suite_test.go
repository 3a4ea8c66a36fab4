// Package outage_test shows what a cluster does while virt-rules is down, on the test cluster
// of test/testcluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
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
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

var (
	suite   *clustersuite.Suite
	cluster *testcluster.Cluster
	k8s     client.Client
	ctx     context.Context
	// webhooks are virt-rules' webhook configurations, pointed at this process.
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
	suite = clustersuite.Begin(60*time.Second, 200*time.Millisecond)
	ctx = suite.Ctx
	var ns []*corev1.Node
	for _, name := range nodes {
		ns = append(ns, testcluster.Node(name, testcluster.Skylake, nil))
	}
	cluster = suite.StartCluster(sctx, testcluster.Options{Nodes: ns})
	k8s = cluster.Client
	// virt-rules, if a spec left it running, stops before the cluster.
	DeferCleanup(func() {
		if running != nil {
			Expect(running.Stop()).To(Succeed())
		}
	})

	By("installing every webhook configuration virt-rules ships, VM defaults included, as shipped")
	webhooks = suite.InstallWebhooks(cluster.Config, "examples/deploy/webhooks", "examples/deploy/defaults/mutating.yaml")
}, NodeTimeout(20*time.Minute))

var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })

// startVirtRules runs every virt-rules controller and webhook in this process, as
// `virt-rules controller` does, where the webhook configurations point.
func startVirtRules() {
	GinkgoHelper()
	Expect(running).To(BeNil(), "virt-rules already runs")
	running = suite.RunVirtRules(cluster, nil, testcluster.VirtRulesOptions{
		Controllers: controllers.Options{ConcurrentSyncs: 2},
		Webhooks:    webhooks,
	})
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
