// Package clustersuite is what the ginkgo suites that run on the test cluster
// (test/testcluster) or on a control plane share: their set-up (Begin, then starting the
// cluster from the cached binaries, CRDs, webhook configurations and virt-rules itself, all
// stopped when the suite ends), the logs of every component in the report of a failed spec,
// and reading objects as stored.
package clustersuite

import (
	"context"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	virtrego "github.com/virt-rules/virt-rules/rego"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// Start starts the test cluster as o says: its binaries come from KUBEBUILDER_ASSETS and
// KUBEVIRT_ASSETS or, unset, from hack/control-plane.sh and hack/kubevirt.sh under repoRoot.
// The caller stops it (Suite.StartCluster stops it when the suite ends).
func Start(sctx SpecContext, repoRoot string, o testcluster.Options) *testcluster.Cluster {
	GinkgoHelper()
	o.ControlPlaneAssets = Assets(sctx, repoRoot, "KUBEBUILDER_ASSETS", "control-plane.sh", GinkgoWriter)
	o.KubeVirtAssets = Assets(sctx, repoRoot, "KUBEVIRT_ASSETS", "kubevirt.sh", GinkgoWriter)
	cluster, err := testcluster.Start(sctx, o)
	Expect(err).NotTo(HaveOccurred())
	return cluster
}

// Assets is testcluster.Assets: the folder in env, or the one the build script under hack/
// prints, which writes its progress to progress.
func Assets(sctx SpecContext, repoRoot, env, script string, progress io.Writer) string {
	GinkgoHelper()
	By("getting binaries from $" + env + " or hack/" + script)
	dir, err := testcluster.Assets(sctx, repoRoot, env, script, progress)
	Expect(err).NotTo(HaveOccurred())
	return dir
}

// ReportLogsOnFailure puts the tail of every component's log into the report of a failed
// spec; cluster gives the suite's cluster, nil before it started. Call it at the top level:
//
//	var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })
func ReportLogsOnFailure(cluster func() *testcluster.Cluster) bool {
	return ReportAfterEach(func(report SpecReport) {
		if c := cluster(); report.Failed() && c != nil {
			AddReportEntry("test cluster logs", c.Logs(40))
		}
	})
}

// FromYAML is the object written as YAML.
func FromYAML(doc string) *unstructured.Unstructured {
	GinkgoHelper()
	data, err := yaml.YAMLToJSON([]byte(doc))
	Expect(err).NotTo(HaveOccurred())
	obj := &unstructured.Unstructured{}
	Expect(obj.UnmarshalJSON(data)).To(Succeed())
	return obj
}

// Get reads the object of kind gvk named ns/name, as stored.
func Get(ctx context.Context, c client.Reader, gvk schema.GroupVersionKind, ns, name string) func(g Gomega) *unstructured.Unstructured {
	return func(g Gomega) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		g.Expect(c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, u)).To(Succeed())
		return u
	}
}

// Cordon marks node unschedulable with a merge patch, as kubectl cordon does: a controller
// writing the node meanwhile (a node labeller) never makes it conflict.
func Cordon(ctx context.Context, c client.Writer, node string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	return c.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`)))
}

// Field is the value at path in obj, or nil.
func Field(obj *unstructured.Unstructured, path ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(obj.Object, path...)
	return v
}

// Stop stops a process the suite started: SIGTERM, then a kill once grace has passed. It
// returns once the process has exited (a process already waited for is left alone).
func Stop(cmd *exec.Cmd, grace time.Duration) {
	if cmd.ProcessState != nil {
		return
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	Terminate(cmd.Process, exited, grace)
}

// Terminate is Stop for a process something else waits for: exited is closed when it has
// exited. It returns once it has.
func Terminate(p *os.Process, exited <-chan struct{}, grace time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = p.Kill()
		<-exited
	}
}

// FreeAddress is a local TCP address nothing listens on now.
func FreeAddress() string {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().String()
}

// ShippedBundleDir is a copy of the embedded bundle without its Rego tests (they assume the
// shipped settings), as `opa build --ignore '*_test.rego'` would build it, in a temporary
// directory a spec may edit.
func ShippedBundleDir() string {
	GinkgoHelper()
	dir := filepath.Join(GinkgoT().TempDir(), "bundle")
	Expect(os.CopyFS(dir, virtrego.Bundle())).To(Succeed())
	RemoveRegoTests(dir)
	return dir
}

// RemoveRegoTests removes the Rego tests (*_test.rego) from the bundle directory dir.
func RemoveRegoTests(dir string) {
	GinkgoHelper()
	Expect(filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "_test.rego") {
			return os.Remove(p)
		}
		return err
	})).To(Succeed())
}
