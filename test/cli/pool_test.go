package cli_test

import (
	"encoding/json"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

type poolPlan struct {
	Pool        string   `json:"pool"`
	Create      []string `json:"create"`
	Delete      []string `json:"delete"`
	Update      []string `json:"update"`
	Restart     []string `json:"restart"`
	Reprovision []string `json:"reprovision"`
}

func poolsOf(stdout string) map[string]poolPlan {
	GinkgoHelper()
	var out struct {
		Pools []poolPlan `json:"pools"`
	}
	Expect(json.Unmarshal([]byte(stdout), &out)).To(Succeed(), stdout)
	plans := map[string]poolPlan{}
	for _, p := range out.Pools {
		plans[p.Pool] = p
	}
	return plans
}

// healingPool is a pool whose only VM keeps failing to start; it was re-provisioned twice
// already, last at 12:00:00, so the third waits 20 s (bundle data: 10 s doubling).
const healingPool = `apiVersion: pool.virt-rules.io/v1alpha1
kind: VirtualMachinePool
metadata: {name: heal, namespace: ops, uid: pool-uid}
spec:
  replicas: 1
  autohealing: {startupFailureThreshold: 3}
  template: {spec: {running: true, template: {spec: {domain: {devices: {}, resources: {requests: {memory: 64Mi}}}}}}}
status:
  reprovisions: [{name: heal-1, count: 2, lastTime: "2026-03-01T12:00:00Z"}]
---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: heal-1
  namespace: ops
  ownerReferences: [{apiVersion: pool.virt-rules.io/v1alpha1, kind: VirtualMachinePool, name: heal, uid: pool-uid, controller: true}]
spec: {running: true, template: {spec: {domain: {devices: {}, resources: {requests: {memory: 64Mi}}}}}}
status: {startFailure: {consecutiveFailCount: 3}}
`

var _ = Describe("eval pools", func() {
	It("plans the design's pools and its naming example", func() {
		r := run("", "eval", "examples/pool")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		plans := poolsOf(r.stdout)
		Expect(plans).To(HaveLen(4))
		Expect(plans["naming/my-vm"].Delete).To(Equal([]string{"my-vm-2"}))
		Expect(plans["naming/my-vm"].Create).To(BeEmpty())
		for _, ns := range []string{"offline", "manual", "ordered"} {
			Expect(plans[ns+"/my-vm-pool"].Create).To(HaveLen(100), ns)
			Expect(plans[ns+"/my-vm-pool"].Create).To(ContainElements("my-vm-pool-1", "my-vm-pool-100"), ns)
		}
	})

	It("makes plans reproducible with --now", func() {
		f := writeTemp("heal.yaml", healingPool)
		early := run("", "eval", "--now", "2026-03-01T12:00:19Z", f)
		Expect(early.exitCode).To(Equal(0), early.stderr)
		Expect(poolsOf(early.stdout)["ops/heal"].Reprovision).To(BeEmpty())
		due := run("", "eval", "--now", "2026-03-01T12:00:20Z", f)
		Expect(due.exitCode).To(Equal(0), due.stderr)
		Expect(poolsOf(due.stdout)["ops/heal"].Reprovision).To(Equal([]string{"heal-1"}))
		Expect(run("", "eval", "--now", "2026-03-01T12:00:20Z", f).stdout).To(Equal(due.stdout))

		bad := run("", "eval", "--now", "noon", f)
		Expect(bad.exitCode).NotTo(Equal(0))
		Expect(bad.stderr).To(ContainSubstring("--now noon: want an RFC 3339 time"))
	})

	It("changes the Random order through bundle data alone", func() {
		// The naming example's my-vm-2 is stopped; preferring ready VMs takes another.
		bundle := bundleWithData("virtrules/pool/data.json", `"prefer": ["stopped", "notReady"]`, `"prefer": ["ready"]`)
		r := run("", "eval", "--bundle", bundle, "examples/pool")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(poolsOf(r.stdout)["naming/my-vm"].Delete).To(ConsistOf(BeElementOf("my-vm-1", "my-vm-3")))
	})

	It("switches to KubeVirt's pool semantics through bundle data alone", func() {
		bundle := bundleWithData("virtrules/pool/data.json", `"semantics": "default"`, `"semantics": "kubevirt"`)
		r := run("", "eval", "--bundle", bundle, "examples/pool")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		// KubeVirt numbers VMs from 0.
		Expect(poolsOf(r.stdout)["ordered/my-vm-pool"].Create).To(ContainElements("my-vm-pool-0", "my-vm-pool-99"))
		Expect(poolsOf(r.stdout)["ordered/my-vm-pool"].Create).NotTo(ContainElement("my-vm-pool-100"))
	})

	It("prints one table row per pool", func() {
		r := run("", "eval", "-o", "table", "examples/pool")
		Expect(r.exitCode).To(Equal(0), r.stderr)
		Expect(r.stdout).To(MatchRegexp(`POOL\s+CREATE\s+DELETE\s+UPDATE\s+RESTART\s+REPROVISION`))
		Expect(r.stdout).To(MatchRegexp(`naming/my-vm\s+0\s+1\s+0\s+0\s+0`))
	})

	It("reports an invalid pool as its errors, at the line of each field at fault, and decides the rest", func() {
		f := writeTemp("bad.yaml", strings.Replace(healingPool, "autohealing: {startupFailureThreshold: 3}",
			"scaleInStrategy: {proactive: {statePreservation: Online}, unmanaged: {}}", 1))
		r := run("", "eval", f)
		Expect(r.exitCode).To(Equal(1), r.stderr)
		Expect(r.stderr).To(ContainSubstring("error: " + f + ":6: VirtualMachinePool ops/heal: spec.scaleInStrategy: set exactly one of unmanaged, opportunistic, proactive"))
		Expect(r.stderr).To(ContainSubstring("error: " + f + ":6: VirtualMachinePool ops/heal: spec.scaleInStrategy.proactive.statePreservation: Online is not supported"))
		var report struct {
			Pools  []any `json:"pools"`
			Errors []struct {
				Kind, Namespace, Name, Location, Field, Reason string
			} `json:"errors"`
			MigrationPolicies []struct{ VMI string } `json:"migrationPolicies"`
		}
		Expect(json.Unmarshal([]byte(r.stdout), &report)).To(Succeed(), r.stdout)
		Expect(report.Pools).To(BeEmpty())
		Expect(report.Errors).To(HaveLen(2))
		for _, e := range report.Errors {
			Expect([]string{e.Kind, e.Namespace, e.Name, e.Location, e.Reason}).To(Equal([]string{"VirtualMachinePool", "ops", "heal", f + ":6", "Invalid"}))
		}
	})
})
