// Package install_test installs virt-rules as an admin would, on the test cluster of
// test/testcluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
// nodes, KubeVirt's own virt-controller and virt-api): examples/deploy rendered by kustomize's
// own library (krusty, what `kubectl apply -k` runs) and applied server-side in kustomize's
// order, then two `virt-rules controller` processes of the built binary, each as the kit's
// service account (a kubeconfig with its token), managing their own webhook certificate.
//
// The binaries come from KUBEBUILDER_ASSETS and KUBEVIRT_ASSETS; unset, the suite runs
// hack/control-plane.sh and hack/kubevirt.sh.
package install_test

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

var (
	suite *clustersuite.Suite
	// cluster is the test cluster once startCluster started it, k8s its admin client.
	cluster  *testcluster.Cluster
	k8s      client.Client
	ctx      context.Context
	repoRoot string
	// binary is bin/virt-rules built for this suite.
	binary string
	// workDir keeps the replicas' kubeconfig, certificates and logs for the whole suite.
	workDir string
)

func TestInstall(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules installed from examples/deploy")
}

var _ = BeforeSuite(func() {
	suite = clustersuite.Begin(60*time.Second, 200*time.Millisecond)
	ctx, repoRoot = suite.Ctx, suite.RepoRoot
})

// startCluster builds bin/virt-rules and starts the test cluster, for the specs that install
// (the rendering specs need neither), once for the suite.
func startCluster(sctx SpecContext) {
	GinkgoHelper()
	if cluster != nil {
		return
	}
	var err error
	workDir, err = os.MkdirTemp("", "virt-rules-install-")
	Expect(err).NotTo(HaveOccurred())
	binary = clustersuite.BuildVirtRules(sctx, repoRoot, workDir)

	cluster = clustersuite.Start(sctx, repoRoot, testcluster.Options{
		Nodes:  []*corev1.Node{testcluster.Node("node-1", testcluster.Skylake, nil)},
		Logger: suite.Logger,
		// helm uninstall's pre-delete hook is a Job: the real job controller makes its pod
		// and marks it Complete (helm_test.go plays the hook pod's kubelet).
		Controllers: []string{"job-controller"},
	})
	k8s = cluster.Client
}

// The cluster, started by a spec, lives until the suite ends.
var _ = AfterSuite(func() {
	if cluster != nil {
		Expect(cluster.Stop()).To(Succeed())
	}
	if workDir != "" {
		Expect(os.RemoveAll(workDir)).To(Succeed())
	}
})

var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })

func readFile(path string) []byte {
	GinkgoHelper()
	data, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	return data
}
