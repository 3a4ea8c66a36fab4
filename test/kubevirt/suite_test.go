// Package kubevirt_test runs virt-rules beside KubeVirt itself: the test cluster of
// test/testcluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
// nodes, KubeVirt's own virt-controller and virt-api with the CRDs, RBAC and webhooks its
// operator generates, and the virt-handler stand-in), with virt-rules' controllers and
// webhooks in this process, called by kube-apiserver as in a cluster. Objects are created as a
// user would; what KubeVirt then writes is the oracle.
//
// The binaries come from KUBEBUILDER_ASSETS and KUBEVIRT_ASSETS; unset, the suite runs
// hack/control-plane.sh and hack/kubevirt.sh, which build them from the Go module proxy the
// first time on a machine and return their cache at once after that.
package kubevirt_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

var (
	// suite is the suite's context, repository and logger.
	suite *clustersuite.Suite
	// cluster is the test cluster, k8s its admin client; ctx and repoRoot are suite's.
	cluster  *testcluster.Cluster
	k8s      client.Client
	ctx      context.Context
	repoRoot string
	// defaulterURL is the VM defaulter service's, "" when this binary has no libvirt.
	defaulterURL string
)

// The suite's nodes: four Skylake nodes in two zones, two with SSDs.
var nodeLabels = map[string]map[string]string{
	"node-1": {"topology.kubernetes.io/zone": "zone-a", "disktype": "ssd"},
	"node-2": {"topology.kubernetes.io/zone": "zone-a", "disktype": "ssd"},
	"node-3": {"topology.kubernetes.io/zone": "zone-b", "disktype": "hdd"},
	"node-4": {"topology.kubernetes.io/zone": "zone-b", "disktype": "hdd"},
}

func TestKubeVirt(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules beside KubeVirt")
}

var _ = BeforeSuite(func(sctx SpecContext) {
	suite = clustersuite.Begin(60*time.Second, 200*time.Millisecond)
	ctx, repoRoot = suite.Ctx, suite.RepoRoot
	var nodes []*corev1.Node
	for name, labels := range nodeLabels {
		nodes = append(nodes, testcluster.Node(name, testcluster.Skylake, labels))
	}
	cluster = suite.StartCluster(sctx, testcluster.Options{Nodes: nodes})
	k8s = cluster.Client
	// Not CDI's DataVolume: virt-controller takes its CRD for an installed CDI and would wait
	// on CDI's controllers.
	suite.InstallPoolCRD(cluster.Config)
	defaulterURL = startDefaulter()
	startVirtRules(defaulterURL)
}, NodeTimeout(20*time.Minute))

var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })

// defaultsNamespaceLabel marks the namespaces whose VMs the VM defaults webhook serves in this
// suite, so the specs of the other designs see KubeVirt's VMs without it.
const defaultsNamespaceLabel = "virt-rules.test/defaults"

// startDefaulter serves the VM defaulter (defaults.Service on an embedded libvirt) for the
// defaults webhook and returns its URL; "" when this binary has no libvirt.
func startDefaulter() string {
	GinkgoHelper()
	root, err := os.MkdirTemp("/dev/shm", "virt-rules-kubevirt-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, root)
	lv, err := defaults.OpenLibvirt(ctx, root, suite.Logger)
	if errors.Is(err, defaults.ErrNoLibvirt) {
		return ""
	}
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(lv.Close)
	svc := defaults.NewService(suite.Engine(), suite.Logger)
	svc.SetHypervisor(lv)
	server := httptest.NewServer(svc)
	DeferCleanup(server.Close)
	return server.URL
}

// startVirtRules runs every virt-rules controller and webhook in this process until the
// suite ends, as `virt-rules controller` does, with virt-rules' webhook configurations
// pointed at it. With a defaulter, the VM defaults webhook too, for namespaces labelled
// defaultsNamespaceLabel.
func startVirtRules(defaulterURL string) {
	GinkgoHelper()
	paths := []string{"examples/deploy/webhooks"}
	if defaulterURL != "" {
		paths = append(paths, "examples/deploy/defaults/mutating.yaml")
	}
	webhooks := suite.InstallWebhooks(cluster.Config, paths...)
	if defaulterURL != "" {
		config := &admissionregistrationv1.MutatingWebhookConfiguration{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "zz-virt-rules-defaults"}, config)).To(Succeed())
		for i := range config.Webhooks {
			config.Webhooks[i].NamespaceSelector.MatchLabels = map[string]string{defaultsNamespaceLabel: "true"}
		}
		Expect(k8s.Update(ctx, config)).To(Succeed())
	}
	vr := suite.RunVirtRules(cluster, nil, testcluster.VirtRulesOptions{
		Controllers: controllers.Options{ConcurrentSyncs: 4, DefaulterURL: defaulterURL, DefaulterTimeout: 4 * time.Second},
		Webhooks:    webhooks,
	})
	DeferCleanup(vr.Stop)
}

// namespace creates a namespace for one container of specs, deleted (by the namespace
// controller, with everything in it) when they end.
func namespace(labels map[string]string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-", Labels: labels}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8s.Delete(ctx, ns))).To(Succeed()) })
	return ns.Name
}

// apply creates the object written as YAML (in ns when it has no namespace) as a user would,
// through every admission webhook, and returns what the server stored.
func apply(ns, doc string, args ...any) *unstructured.Unstructured {
	GinkgoHelper()
	obj := fromYAML(fmt.Sprintf(doc, args...))
	if obj.GetNamespace() == "" {
		obj.SetNamespace(ns)
	}
	Expect(k8s.Create(ctx, obj)).To(Succeed())
	return obj
}

// fromYAML is the object written as YAML.
var fromYAML = clustersuite.FromYAML

// get reads the object of kind like obj named ns/name, as stored.
func get(like *unstructured.Unstructured, ns, name string) func(g Gomega) *unstructured.Unstructured {
	return clustersuite.Get(ctx, k8s, like.GroupVersionKind(), ns, name)
}

// update reads like's kind ns/name, changes it and writes it back, read again after a
// conflict: KubeVirt's controllers write the same objects meanwhile. change's assertions go
// through g, so a failed one is tried again too. It returns what it wrote.
func update(like *unstructured.Unstructured, ns, name string, change func(g Gomega, obj *unstructured.Unstructured)) *unstructured.Unstructured {
	GinkgoHelper()
	var obj *unstructured.Unstructured
	Eventually(func(g Gomega) {
		obj = get(like, ns, name)(g)
		change(g, obj)
		g.Expect(k8s.Update(ctx, obj)).To(Succeed())
	}).Should(Succeed())
	return obj
}

// field is the value at path in obj, or nil.
var field = clustersuite.Field
