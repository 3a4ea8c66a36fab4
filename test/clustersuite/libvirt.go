package clustersuite

import (
	"context"
	"os"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
)

// Defaulter opens the embedded QEMU driver of libvirt (defaults.OpenLibvirt) in a new
// directory on tmpfs whose name starts with prefix, both closed and removed by the current
// node's cleanups, and returns it with a defaulter asking it and a new engine on the embedded
// bundle. For suites built with libvirt (-tags libvirt).
func Defaulter(ctx context.Context, prefix string) (*defaults.Libvirt, *defaults.Defaulter) {
	GinkgoHelper()
	root, err := os.MkdirTemp(defaults.TmpfsDir(), prefix)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, root)
	eng, err := engine.New(ctx)
	Expect(err).NotTo(HaveOccurred())
	lv, err := defaults.OpenLibvirt(ctx, root, nil)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(lv.Close)
	return lv, &defaults.Defaulter{Engine: eng, Hypervisor: lv}
}
