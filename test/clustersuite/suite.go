package clustersuite

import (
	"bytes"
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/open-policy-agent/opa/v1/compile"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// Suite is what one suite's BeforeSuite sets up first, for the suite's whole run.
type Suite struct {
	// Ctx lives as long as the suite: it is cancelled when the suite ends, before what
	// StopAtEnd stops.
	Ctx context.Context
	// RepoRoot is the repository's top directory.
	RepoRoot string
	// Logger writes to GinkgoWriter, at level info.
	Logger *slog.Logger
	cancel context.CancelFunc
}

// Begin starts a suite, from its BeforeSuite (its cleanups run when the suite ends): Eventually
// polls every polling for at most timeout unless told otherwise, and the suite's context and
// logger. Controllers converge asynchronously and a loaded 2-core machine is slow: Eventually
// returns as soon as its condition holds, so timeout only bounds failures.
func Begin(timeout, polling time.Duration) *Suite {
	GinkgoHelper()
	SetDefaultEventuallyTimeout(timeout)
	SetDefaultEventuallyPollingInterval(polling)
	ctx, cancel := context.WithCancel(context.Background())
	DeferCleanup(cancel)
	return &Suite{
		Ctx:      ctx,
		RepoRoot: RepoRoot(),
		Logger:   slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo})),
		cancel:   cancel,
	}
}

// RepoRoot is the repository's top directory, for a suite in test/X.
func RepoRoot() string {
	GinkgoHelper()
	root, err := filepath.Abs("../..")
	Expect(err).NotTo(HaveOccurred())
	return root
}

// StopAtEnd stops what stop stops when the suite ends, after cancelling Ctx, within a minute
// past its timeout. Called from BeforeSuite, it runs after every AfterSuite; what the suite
// set up after it is stopped before it.
func (s *Suite) StopAtEnd(stop func() error) {
	GinkgoHelper()
	DeferCleanup(func(SpecContext) {
		s.cancel()
		Expect(stop()).To(Succeed())
	}, GracePeriod(time.Minute))
}

// StartCluster starts the test cluster (Start, with s's logger unless o has one) and stops it
// when the suite ends. controller-runtime logs to s's logger.
func (s *Suite) StartCluster(sctx SpecContext, o testcluster.Options) *testcluster.Cluster {
	GinkgoHelper()
	ctrl.SetLogger(logr.FromSlogHandler(s.Logger.Handler()))
	if o.Logger == nil {
		o.Logger = s.Logger
	}
	cluster := Start(sctx, s.RepoRoot, o)
	s.StopAtEnd(cluster.Stop)
	return cluster
}

// InstallPoolCRD installs the CustomResourceDefinition KubeVirt does not ship that every virt-rules
// controller reads: virt-rules' own VirtualMachinePool.
func (s *Suite) InstallPoolCRD(cfg *rest.Config) {
	GinkgoHelper()
	_, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{ErrorIfPathMissing: true, Paths: []string{
		filepath.Join(s.RepoRoot, "examples", "deploy", "crds", "pool.virt-rules.io_virtualmachinepools.yaml"),
	}})
	Expect(err).NotTo(HaveOccurred())
}

// InstallWebhooks installs the webhook configurations in paths (relative to the repository,
// e.g. examples/deploy/webhooks) pointed at this process, as envtest does.
func (s *Suite) InstallWebhooks(cfg *rest.Config, paths ...string) *envtest.WebhookInstallOptions {
	GinkgoHelper()
	webhooks := &envtest.WebhookInstallOptions{}
	for _, p := range paths {
		webhooks.Paths = append(webhooks.Paths, filepath.Join(s.RepoRoot, p))
	}
	Expect(webhooks.Install(cfg)).To(Succeed())
	return webhooks
}

// Engine is a new engine on the embedded bundle, logging to s's logger.
func (s *Suite) Engine() *engine.Engine {
	GinkgoHelper()
	eng, err := engine.New(s.Ctx, engine.WithLogger(s.Logger))
	Expect(err).NotTo(HaveOccurred())
	return eng
}

// RunVirtRules runs every virt-rules controller and webhook in this process against cluster,
// as `virt-rules controller` does (testcluster.RunVirtRules), asking eng (nil: a new Engine).
// The caller stops it.
func (s *Suite) RunVirtRules(cluster *testcluster.Cluster, eng *engine.Engine, o testcluster.VirtRulesOptions) *testcluster.VirtRules {
	GinkgoHelper()
	if eng == nil {
		eng = s.Engine()
	}
	vr, err := testcluster.RunVirtRules(s.Ctx, cluster.Config, eng, o)
	Expect(err).NotTo(HaveOccurred())
	return vr
}

// BuildVirtRules builds `virt-rules` from this tree into dir ("": a temporary directory of
// the current node) and returns its path.
func BuildVirtRules(sctx SpecContext, repoRoot, dir string) string {
	GinkgoHelper()
	By("building virt-rules")
	if dir == "" {
		dir = GinkgoT().TempDir()
	}
	binary := filepath.Join(dir, "virt-rules")
	build := exec.CommandContext(sctx, "go", "build", "-o", binary, "./cmd/virt-rules")
	build.Dir = repoRoot
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build: %s", out)
	return binary
}

// RunBinary runs binary with args: its stdout, stderr and exit status. An error is one that
// kept it from running at all (an exit status other than 0 is none).
func RunBinary(ctx context.Context, binary string, args ...string) (stdout, stderr string, code int, err error) {
	cmd := exec.CommandContext(ctx, binary, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if exit, ok := err.(*exec.ExitError); ok {
		code, err = exit.ExitCode(), nil
	}
	return out.String(), errOut.String(), code, err
}

// ShippedBundle is the shipped bundle (ShippedBundleDir) built as a bundle tarball of
// revision rev.
func ShippedBundle(ctx context.Context, rev string) []byte {
	GinkgoHelper()
	dir := ShippedBundleDir()
	var out bytes.Buffer
	Expect(compile.New().WithPaths(dir).WithAsBundle(true).WithRevision(rev).WithOutput(&out).Build(ctx)).To(Succeed())
	return out.Bytes()
}
