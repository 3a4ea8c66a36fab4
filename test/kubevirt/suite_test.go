// Package kubevirt_test runs virt-rules beside KubeVirt itself: the test cluster of
// internal/testcluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
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
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/testcluster"
)

var (
	cluster  *testcluster.Cluster
	k8s      client.Client
	ctx      context.Context
	cancel   context.CancelFunc
	repoRoot string
	stopMgr  func()
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
	SetDefaultEventuallyTimeout(60 * time.Second)
	SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	repoRoot, err = filepath.Abs("../..")
	Expect(err).NotTo(HaveOccurred())
	logger := slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var nodes []*corev1.Node
	for name, labels := range nodeLabels {
		nodes = append(nodes, testcluster.Node(name, testcluster.Skylake, labels))
	}
	cluster, err = testcluster.Start(sctx, testcluster.Options{
		ControlPlaneAssets: assets(sctx, "KUBEBUILDER_ASSETS", "control-plane.sh"),
		KubeVirtAssets:     assets(sctx, "KUBEVIRT_ASSETS", "kubevirt.sh"),
		Nodes:              nodes,
		Logger:             logger,
	})
	Expect(err).NotTo(HaveOccurred())
	k8s = cluster.Client
	// What KubeVirt does not ship: virt-rules' own VirtualMachinePool. Not CDI's DataVolume:
	// virt-controller takes its CRD for an installed CDI and would wait on CDI's controllers.
	_, err = envtest.InstallCRDs(cluster.Config, envtest.CRDInstallOptions{ErrorIfPathMissing: true, Paths: []string{
		filepath.Join(repoRoot, "examples", "deploy", "crds", "pool.virt-rules.io_virtualmachinepools.yaml"),
	}})
	Expect(err).NotTo(HaveOccurred())
	defaulterURL = startDefaulter(logger)
	stopMgr = startVirtRules(logger, defaulterURL)
}, NodeTimeout(20*time.Minute))

var _ = AfterSuite(func() {
	if stopMgr != nil {
		stopMgr()
	}
	if cancel != nil {
		cancel()
	}
	if cluster != nil {
		Expect(cluster.Stop()).To(Succeed())
	}
})

// On failure, the tail of every component's log goes into the report.
var _ = ReportAfterEach(func(report SpecReport) {
	if report.Failed() && cluster != nil {
		AddReportEntry("test cluster logs", cluster.Logs(40))
	}
})

// defaultsNamespaceLabel marks the namespaces whose VMs the VM defaults webhook serves in this
// suite, so the specs of the other designs see KubeVirt's VMs without it.
const defaultsNamespaceLabel = "virt-rules.test/defaults"

// startDefaulter serves the VM defaulter (defaults.Service on an embedded libvirt) for the
// defaults webhook and returns its URL; "" when this binary has no libvirt.
func startDefaulter(logger *slog.Logger) string {
	GinkgoHelper()
	root, err := os.MkdirTemp("/dev/shm", "virt-rules-kubevirt-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, root)
	lv, err := defaults.OpenLibvirt(ctx, root, logger)
	if errors.Is(err, defaults.ErrNoLibvirt) {
		return ""
	}
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(lv.Close)
	eng, err := engine.New(ctx, engine.WithLogger(logger))
	Expect(err).NotTo(HaveOccurred())
	svc := defaults.NewService(eng, logger)
	svc.SetHypervisor(lv)
	server := httptest.NewServer(svc)
	DeferCleanup(server.Close)
	return server.URL
}

// startVirtRules runs every virt-rules controller and webhook in this process, as
// `virt-rules controller` does, with virt-rules' webhook configurations pointed at it. With a
// defaulter, the VM defaults webhook too, for namespaces labelled defaultsNamespaceLabel.
func startVirtRules(logger *slog.Logger, defaulterURL string) (stop func()) {
	GinkgoHelper()
	ctrl.SetLogger(logr.FromSlogHandler(logger.Handler()))
	paths := []string{filepath.Join(repoRoot, "examples", "deploy", "webhooks")}
	if defaulterURL != "" {
		paths = append(paths, filepath.Join(repoRoot, "examples", "deploy", "defaults", "mutating.yaml"))
	}
	webhooks := &envtest.WebhookInstallOptions{Paths: paths}
	Expect(webhooks.Install(cluster.Config)).To(Succeed())
	if defaulterURL != "" {
		config := &admissionregistrationv1.MutatingWebhookConfiguration{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "zz-virt-rules-defaults"}, config)).To(Succeed())
		for i := range config.Webhooks {
			config.Webhooks[i].NamespaceSelector.MatchLabels = map[string]string{defaultsNamespaceLabel: "true"}
		}
		Expect(k8s.Update(ctx, config)).To(Succeed())
	}
	eng, err := engine.New(ctx, engine.WithLogger(logger))
	Expect(err).NotTo(HaveOccurred())
	vr, err := testcluster.RunVirtRules(ctx, cluster.Config, eng, testcluster.VirtRulesOptions{
		Controllers: controllers.Options{ConcurrentSyncs: 4, DefaulterURL: defaulterURL, DefaulterTimeout: 4 * time.Second},
		Webhooks:    webhooks,
	})
	Expect(err).NotTo(HaveOccurred())
	return func() { Expect(vr.Stop()).To(Succeed()) }
}

// assets is testcluster.Assets: the folder in env, or the one the build script prints.
func assets(sctx SpecContext, env, script string) string {
	GinkgoHelper()
	By("getting binaries from $" + env + " or hack/" + script)
	dir, err := testcluster.Assets(sctx, repoRoot, env, script, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	return dir
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

func fromYAML(doc string) *unstructured.Unstructured {
	GinkgoHelper()
	data, err := yaml.YAMLToJSON([]byte(doc))
	Expect(err).NotTo(HaveOccurred())
	obj := &unstructured.Unstructured{}
	Expect(obj.UnmarshalJSON(data)).To(Succeed())
	return obj
}

// get reads the object of kind like obj named ns/name.
func get(like *unstructured.Unstructured, ns, name string) func(g Gomega) *unstructured.Unstructured {
	return func(g Gomega) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(like.GroupVersionKind())
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, u)).To(Succeed())
		return u
	}
}

// field is the value at path in obj, or nil.
func field(obj *unstructured.Unstructured, path ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(obj.Object, path...)
	return v
}
