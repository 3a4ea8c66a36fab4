//go:build libvirt

// Package fidelity_test judges virt-rules' VM defaults (design 004) by oracles no one in this
// project wrote: KubeVirt's own admission code, KubeVirt's own converter (through
// kubevirt-oracle, built by hack/kubevirt.sh inside the kubevirt.io/kubevirt module the test
// cluster runs) and libvirt. The VMs are KubeVirt's own examples (read from its module at test
// time) and virt-rules' examples/defaults.
//
// For every VM and VMI:
//
//	(a) the defaulted object is admitted by KubeVirt's validation as it is (no KubeVirt
//	    mutator runs first, as offline);
//	(b) each guest-visible value the defaulter wrote equals what KubeVirt's mutators,
//	    converter and libvirt give the original;
//	(c) converting the defaulted object gives the same guest as converting the original;
//	(d) defaulting the defaulted object changes nothing.
//
// The suite reports how many fields were compared and every mismatch.
//
// It also judges the MigrationPolicy decision and its validation (design 000) by KubeVirt's
// own matchPolicy and MigrationPolicy admitter (kubevirt-oracle migration-policy), over
// generated clusters: see migrationpolicy_test.go.
package fidelity_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/test/clustersuite"
)

var (
	ctx       = context.Background()
	lv        *defaults.Libvirt
	defaulter *defaults.Defaulter
	oracle    string
	repoRoot  string
)

func TestFidelity(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Decisions judged by KubeVirt's own code")
}

var _ = BeforeSuite(func(sctx SpecContext) {
	repoRoot = clustersuite.RepoRoot()
	oracle = filepath.Join(clustersuite.Assets(sctx, repoRoot, "KUBEVIRT_ASSETS", "kubevirt.sh", GinkgoWriter), "kubevirt-oracle")
	Expect(oracle).To(BeAnExistingFile())
	lv, defaulter = clustersuite.Defaulter(ctx, "virt-rules-fidelity-")
}, NodeTimeout(30*time.Minute))
