// Package scheduler_test judges virt-rules' node decisions by kube-scheduler itself. On the test
// cluster of test/testcluster (etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager, kwok nodes, KubeVirt's own virt-controller and virt-api, the
// virt-handler stand-in) with virt-rules' controllers and webhooks in this process, a VM runs
// on one node; then come nodes that differ from it in one way each (CPU vendor, host-model CPU,
// CPU features, machine type, architecture, taints, cordon, capacity, pods, device plugins,
// labels). For a migration, virt-controller renders the target pod; the oracle is the
// scheduler's answer for that very pod on every node, and virt-rules' candidates must be
// exactly the nodes it accepts.
//
// The scheduler answers one node at a time for a copy of the target pod pinned to that node
// (kubernetes.io/hostname ANDed into its node selector, KubeVirt's labels dropped so neither
// KubeVirt nor virt-rules acts on it): bound means the node fits, Unschedulable means it does
// not, with the scheduler's message. The node kube-scheduler bound the real target pod to is
// its own answer. The migration is held before its target is prepared (the stand-in's
// AnnotationHoldMigration), so the cluster stands still while it is judged.
//
// The binaries come from KUBEBUILDER_ASSETS and KUBEVIRT_ASSETS; unset, the suite runs
// hack/control-plane.sh and hack/kubevirt.sh.
package scheduler_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

var (
	cluster *testcluster.Cluster
	k8s     client.Client
	// eng is the engine virt-rules' controllers and webhooks ask.
	eng *engine.Engine
	ctx context.Context
)

// sourceNode is the one node when the VMs start, so every VM runs there.
const sourceNode = "source"

func TestScheduler(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules' node decisions judged by kube-scheduler")
}

var _ = BeforeSuite(func(sctx SpecContext) {
	suite := clustersuite.Begin(60*time.Second, 200*time.Millisecond)
	ctx = suite.Ctx
	cluster = suite.StartCluster(sctx, testcluster.Options{Nodes: []*corev1.Node{source()}})
	k8s = cluster.Client

	// virt-rules' own VirtualMachinePool, whose controller runs with the others.
	suite.InstallPoolCRD(cluster.Config)
	webhooks := suite.InstallWebhooks(cluster.Config, "examples/deploy/webhooks")
	eng = suite.Engine()
	// virt-rules' controllers and webhooks stop before the cluster goes.
	DeferCleanup(suite.RunVirtRules(cluster, eng, testcluster.VirtRulesOptions{
		Controllers: controllers.Options{ConcurrentSyncs: 4},
		Webhooks:    webhooks,
	}).Stop)
}, NodeTimeout(20*time.Minute))

var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })
