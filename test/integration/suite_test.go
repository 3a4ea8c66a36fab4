// Package integration_test runs virt-rules against a real control plane: etcd and
// kube-apiserver started by controller-runtime's envtest, with the CustomResourceDefinitions of
// examples/deploy/crds installed.
//
// The binaries come from KUBEBUILDER_ASSETS; when it is unset the suite runs
// hack/control-plane.sh, which builds them from the Go module proxy the first time on a machine
// (8-13 minutes on 2 cores) and returns its cache at once after that.
package integration_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	migrationsv1alpha1 "kubevirt.io/api/migrations/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// What the specs of this package share, set up by BeforeSuite.
var (
	// cfg reaches the control plane's kube-apiserver as an admin (system:masters).
	cfg *rest.Config
	// k8sClient knows client-go's kinds, CustomResourceDefinitions and KubeVirt's typed
	// VirtualMachineInstance, VirtualMachineInstanceMigration, KubeVirt and MigrationPolicy;
	// any other kind goes through *unstructured.Unstructured.
	k8sClient client.Client
	// ctx lives as long as the suite.
	ctx context.Context
	// repoRoot is the repository's top directory.
	repoRoot string
	// crdDir holds the CustomResourceDefinitions the suite installs.
	crdDir string

	testEnv *envtest.Environment
	cancel  context.CancelFunc
)

func TestIntegration(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules integration")
}

// Suite nodes take a context so that on an interrupt Ginkgo waits for them (up to the grace
// period) instead of exiting while processes are being started or stopped: a half-done Stop
// leaves etcd running.
var _ = BeforeSuite(func(sctx SpecContext) {
	// Controllers converge asynchronously; on a loaded 2-core machine a second is not always
	// enough. Eventually returns as soon as its condition holds, so this only bounds failures.
	SetDefaultEventuallyTimeout(20 * time.Second)
	SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	repoRoot, err = filepath.Abs("../..")
	Expect(err).NotTo(HaveOccurred())
	crdDir = filepath.Join(repoRoot, "examples", "deploy", "crds")

	testEnv = &envtest.Environment{
		BinaryAssetsDirectory: controlPlaneAssets(sctx),
		CRDDirectoryPaths:     []string{crdDir},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred(), "start the control plane (etcd, kube-apiserver) from %s", testEnv.BinaryAssetsDirectory)

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
	Expect(kubevirtv1.AddToScheme(scheme)).To(Succeed())
	Expect(migrationsv1alpha1.AddToScheme(scheme)).To(Succeed())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
}, GracePeriod(time.Minute))

var _ = AfterSuite(func(SpecContext) {
	if cancel != nil {
		cancel()
	}
	if testEnv != nil {
		// Stop waits for etcd and kube-apiserver to exit and removes their directories.
		Expect(testEnv.Stop()).To(Succeed())
	}
}, GracePeriod(time.Minute))

// controlPlaneAssets is the folder holding etcd and kube-apiserver: KUBEBUILDER_ASSETS, or the
// last line hack/control-plane.sh prints. Its progress goes to stderr as it happens, since a
// cold build takes minutes; an interrupt stops the build (go included) with SIGTERM.
func controlPlaneAssets(sctx SpecContext) string {
	GinkgoHelper()
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir
	}
	script := filepath.Join(repoRoot, "hack", "control-plane.sh")
	By("getting etcd and kube-apiserver from " + script + " (KUBEBUILDER_ASSETS is unset)")
	cmd := exec.CommandContext(sctx, script)
	cmd.Dir = repoRoot
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.Output()
	if err != nil {
		Fail(fmt.Sprintf("run %s: %v", script, err))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	Expect(filepath.Join(dir, "kube-apiserver")).To(BeAnExistingFile(), "%s printed %q", script, dir)
	return dir
}

// create creates obj and deletes it when the spec ends. Controllers under test see every object
// in the cluster, so specs leave it as they found it.
func create(obj client.Object) {
	GinkgoHelper()
	Expect(tryCreate(obj)).To(Succeed())
}

// tryCreate is create for objects the server may refuse: it returns the server's answer.
func tryCreate(obj client.Object) error {
	GinkgoHelper()
	err := k8sClient.Create(ctx, obj)
	if err == nil {
		DeferCleanup(func() {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed())
		})
	}
	return err
}

// createNamespace creates a namespace with a generated name for one spec and returns its name.
// The control plane has no namespace controller, so it is never really deleted: names are
// generated to keep specs apart.
func createNamespace() string {
	GinkgoHelper()
	ns := &corev1.Namespace{}
	ns.GenerateName = "test-"
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// fromYAML is one object written as YAML, decoded the way the client decodes what the server
// returns, so that what was sent and what comes back compare equal.
func fromYAML(doc string) *unstructured.Unstructured {
	GinkgoHelper()
	data, err := yaml.YAMLToJSON([]byte(doc))
	Expect(err).NotTo(HaveOccurred())
	obj := &unstructured.Unstructured{}
	Expect(obj.UnmarshalJSON(data)).To(Succeed())
	return obj
}
