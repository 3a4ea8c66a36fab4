// Package install_test installs virt-rules as an admin would, on the test cluster of
// internal/testcluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
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
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/internal/testcluster"
)

var (
	cluster  *testcluster.Cluster
	k8s      client.Client
	ctx      context.Context
	cancel   context.CancelFunc
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
	SetDefaultEventuallyTimeout(60 * time.Second)
	SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	repoRoot, err = filepath.Abs("../..")
	Expect(err).NotTo(HaveOccurred())

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
	By("building bin/virt-rules")
	binary = filepath.Join(workDir, "virt-rules")
	build := exec.CommandContext(sctx, "go", "build", "-o", binary, "./cmd/virt-rules")
	build.Dir = repoRoot
	build.Stdout, build.Stderr = GinkgoWriter, GinkgoWriter
	Expect(build.Run()).To(Succeed())

	logger := slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cluster, err = testcluster.Start(sctx, testcluster.Options{
		ControlPlaneAssets: assets(sctx, "KUBEBUILDER_ASSETS", "control-plane.sh"),
		KubeVirtAssets:     assets(sctx, "KUBEVIRT_ASSETS", "kubevirt.sh"),
		Nodes:              []*corev1.Node{testcluster.Node("node-1", testcluster.Skylake, nil)},
		Logger:             logger,
		// helm uninstall's pre-delete hook is a Job: the real job controller makes its pod
		// and marks it Complete (helm_test.go plays the hook pod's kubelet).
		Controllers: []string{"job-controller"},
	})
	Expect(err).NotTo(HaveOccurred())
	k8s = cluster.Client
}

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	if cluster != nil {
		Expect(cluster.Stop()).To(Succeed())
	}
	if workDir != "" {
		Expect(os.RemoveAll(workDir)).To(Succeed())
	}
})

// On failure, the tail of every component's log goes into the report.
var _ = ReportAfterEach(func(report SpecReport) {
	if report.Failed() && cluster != nil {
		AddReportEntry("test cluster logs", cluster.Logs(40))
	}
})

func assets(sctx SpecContext, env, script string) string {
	GinkgoHelper()
	By("getting binaries from $" + env + " or hack/" + script)
	dir, err := testcluster.Assets(sctx, repoRoot, env, script, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	return dir
}

func readFile(path string) []byte {
	GinkgoHelper()
	data, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	return data
}
