// Package realnode_test runs virt-rules' own images as real pods (issue 40, stage 1): the test
// cluster of test/testcluster with a real node beside it (testcluster.AddRealNode: Debian's
// containerd and runc, kubelet built from the Go module proxy, a CNI bridge of its own), first
// a plain pod of the controller image, then the install kit, examples/deploy, as an admin
// applies it.
//
// It needs root (kubelet and containerd do) and the binaries: KUBEBUILDER_ASSETS and
// KUBEVIRT_ASSETS as for every cluster suite (unset, hack/control-plane.sh and
// hack/kubevirt.sh are run), NODE_ASSETS (hack/node.sh) and VIRT_RULES_IMAGES, the folder
// `make images` writes (bin/images; a relative path is the repository's). Without root, NODE_ASSETS or the controller image it
// skips, saying which.
package realnode_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"

	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// nodeName is the real node's name.
const nodeName = "real-1"

var (
	suite   *clustersuite.Suite
	cluster *testcluster.Cluster
	node    *testcluster.RealNode
	// clientset reads pods' logs, as kubectl logs does (controller-runtime's client cannot).
	clientset *kubernetes.Clientset
	// controllerImage is the controller image's reference on the node, as a pod names it.
	controllerImage string
)

func TestRealNode(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules on a real node")
}

var _ = BeforeSuite(func(sctx SpecContext) {
	if os.Geteuid() != 0 {
		Skip("a real node needs root: kubelet and containerd run as root")
	}
	nodeAssets := os.Getenv("NODE_ASSETS")
	if nodeAssets == "" {
		Skip(`NODE_ASSETS is unset: NODE_ASSETS="$(hack/node.sh)" builds kubelet and installs containerd`)
	}
	images := os.Getenv("VIRT_RULES_IMAGES")
	if images == "" {
		Skip("VIRT_RULES_IMAGES is unset: the folder `make images` writes (bin/images)")
	}
	if !filepath.IsAbs(images) {
		// Relative to the repository, as the Makefile names it.
		images = filepath.Join(clustersuite.RepoRoot(), images)
	}
	layout := filepath.Join(images, "controller")
	if _, err := os.Stat(filepath.Join(layout, "index.json")); err != nil {
		Skip("no controller image in VIRT_RULES_IMAGES (" + err.Error() + "): make images")
	}
	refs, err := testcluster.LayoutImages(layout)
	Expect(err).NotTo(HaveOccurred())
	controllerImage = refs[0]

	suite = clustersuite.Begin(90*time.Second, 200*time.Millisecond)
	// The kit's webhooks are called at their Service's endpoints: the EndpointSlice
	// controller must keep them.
	cluster = suite.StartCluster(sctx, testcluster.Options{
		RealNodes:   true,
		Controllers: []string{"endpointslice-controller", "endpoints-controller"},
	})
	clientset, err = kubernetes.NewForConfig(cluster.Config)
	Expect(err).NotTo(HaveOccurred())

	By("adding real node " + nodeName)
	began := time.Now()
	node, err = cluster.AddRealNode(sctx, testcluster.RealNodeOptions{Name: nodeName, Assets: nodeAssets, Images: []string{layout}})
	Expect(err).NotTo(HaveOccurred())
	AddReportEntry("real node Ready", time.Since(began).Round(time.Millisecond).String())
	// Registered after the cluster's stop, so run before it: the node's pods go while the API
	// server is there to say so.
	DeferCleanup(func(sctx SpecContext) {
		Expect(node.Stop(sctx)).To(Succeed())
	}, NodeTimeout(3*time.Minute))
}, NodeTimeout(30*time.Minute))

var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })
