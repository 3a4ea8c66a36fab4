// Package scale_test is `make scale`: virt-rules at the size of a large KubeVirt cluster, on the
// test cluster of test/testcluster (etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager, kwok nodes, KubeVirt's own virt-controller and virt-api with its
// webhooks, the virt-handler stand-in), with virt-rules running as the real binary
// (`virt-rules controller`, built from this tree, its webhooks called by kube-apiserver). It is
// labelled "scale" and lives in its own package, which `make test` skips.
//
// Everything is created by this process with a client whose QPS and burst are raised, through
// worker pools: SCALE_NODES (5,000) kwok nodes of five CPU generations, labelled as
// virt-handler's node labeller would (cpu-model, cpu-model-migration, host-model-cpu,
// cpu-feature and host-model-required-features labels); SCALE_POLICIES (1,000)
// MigrationPolicies; SCALE_VMIS (10,000) VMIs; SCALE_POOLS (20) VirtualMachinePools of
// SCALE_POOL_VMS (100) VMs; then a burst of SCALE_BURST (1,000) VMI creates. Smaller sizes
// are for development (SCALE_NODES=500 SCALE_VMIS=1000 ...); the README's table is from the
// full size.
//
// The 10,000 VMIs are created directly as VMI objects, through kube-apiserver and every
// admission webhook (KubeVirt's and virt-rules'), not through VMs: a MigrationPolicy decision
// reads only the VMI's labels, its namespace's labels, the policies and the KubeVirt CR. They
// cannot be created Running (KubeVirt's mutating webhook drops the status a VMI is created
// with), and 10,000 virt-launcher pods would cost minutes and gigabytes while measuring
// kube-scheduler and kwok rather than virt-rules; so their disk is a PersistentVolumeClaim
// that never comes and virt-controller keeps them Pending, without pods. The pools are
// different: their VMs must come from virt-rules' pool controller and run through KubeVirt
// (virt-controller makes each VMI and its virt-launcher pod, kube-scheduler places it on a
// kwok node, the stand-in runs it), since that path is what the pool controller waits on; so
// their 2,000 VMs go the real way.
//
// What is right is computed in this process with the Go reference implementations
// (test/reference) from what the cluster holds, never from the controller: the
// migratability level of every node, and every VMI's policy and configuration. Writes are
// counted by watches (metadata informers) as changes of the label or annotations virt-rules
// owns, so a write by anyone counts and a write that changes nothing cannot be told apart
// from no write (the API server stores nothing for it). Each measurement and each bound from
// issue 17 is a row of the table printed at the end (lines starting with SCALE); a bound
// broken fails its spec.
package scale_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/test/clustersuite"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// The sizes, overridable by environment variables.
var (
	numNodes      = envInt("SCALE_NODES", 5000)
	numVMIs       = envInt("SCALE_VMIS", 10000)
	numPolicies   = envInt("SCALE_POLICIES", 1000) // a multiple of policiesPerTeam
	numPools      = envInt("SCALE_POOLS", 20)
	poolVMs       = envInt("SCALE_POOL_VMS", 100)
	numBurst      = envInt("SCALE_BURST", 1000)
	numNamespaces = envInt("SCALE_NAMESPACES", 50)
	// workers is how many requests this process keeps in flight while creating objects.
	workers = envInt("SCALE_WORKERS", 32)
	// policyCreators is how many MigrationPolicy creates are in flight.
	policyCreators = envInt("SCALE_POLICY_WORKERS", 4)
	// concurrentSyncs is the controller's --concurrent-syncs.
	concurrentSyncs = envInt("SCALE_CONCURRENT_SYNCS", 4)
	// nodeLabelWorkers is the controller's --node-label-workers.
	nodeLabelWorkers = envInt("SCALE_NODE_LABEL_WORKERS", 16)
	// policyWorkers is the controller's --migration-policy-workers: VMI annotation writes in
	// flight.
	policyWorkers = envInt("SCALE_MIGRATION_POLICY_WORKERS", 16)
	// floorSample is the most writes a floor row makes itself: a larger change's floor is the
	// time for floorSample writes scaled by how many more it needs, so that the floor rows of
	// the full size (thousands of writes each) do not double the run.
	floorSample = envInt("SCALE_FLOOR_SAMPLE", 1000)
)

var (
	cluster  *testcluster.Cluster
	k8s      client.Client // the admin, at high QPS
	fastCfg  *rest.Config
	ctx      context.Context
	repoRoot string
	// binary is `virt-rules`, built from this tree.
	binary string
	// controller is the `virt-rules controller` process.
	controller     *exec.Cmd
	stopController func()
	// controllerExited is closed when the controller process exits; controllerLog is its log.
	controllerExited chan struct{}
	controllerLog    string
	// metricsURL is the controller's /metrics (plain HTTP on 127.0.0.1).
	metricsURL string
	// pprofAddr serves the controller's /debug/pprof.
	pprofAddr string

	nodes *tracker // every node's migratability level label
	vmis  *tracker // every VMI's policy and configuration annotations
)

func TestScale(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "virt-rules at scale")
}

var _ = BeforeSuite(func(sctx SpecContext) {
	suite := clustersuite.Begin(10*time.Minute, 500*time.Millisecond)
	ctx, repoRoot = suite.Ctx, suite.RepoRoot
	progress("sizes: %d nodes, %d VMIs, %d policies, %d pools of %d VMs, burst %d, %d namespaces; %d CPUs here",
		numNodes, numVMIs, numPolicies, numPools, poolVMs, numBurst, numNamespaces, numCPU())

	binary = clustersuite.BuildVirtRules(sctx, repoRoot, "")

	began := time.Now()
	cluster = suite.StartCluster(sctx, testcluster.Options{
		// 5,000 nodes: kube-controller-manager lifts each new node's not-ready taint, and
		// kube-scheduler binds the pools' pods; their default 20 and 50 requests a second
		// would make the setup, not virt-rules, the thing measured.
		KubeAPIQPS: 500,
		// After thousands of objects and watches, kube-apiserver may drain for longer than a
		// small cluster's minute.
		StopTimeout: 3 * time.Minute,
		// kwok renews each node's Lease every 150 s, not the kubelet's 10 s: at 5,000 nodes
		// those would be 500 writes a second, more than this API server takes of node writes
		// (the floor rows measure it). The table's floors are measured under the same load.
		NodeLeaseDuration: 10 * time.Minute,
		// virt-controller syncs 3 VMs at a time by default; each VMI it creates passes
		// virt-api's webhooks, so the pools' 2,000 VMs became VMIs at about 1.4 a second
		// (200 in 2m15s at 1,000 nodes). The pools are KubeVirt's work, not virt-rules'.
		VirtControllerArgs: []string{"--vm-controller-threads", "16", "--vmi-controller-threads", "16"},
	})
	progress("test cluster up in %s (KubeVirt %s)", since(began), cluster.KubeVirtVersion)

	suite.InstallPoolCRD(cluster.Config)
	fastCfg = rest.CopyConfig(cluster.Config)
	fastCfg.QPS, fastCfg.Burst = 2000, 4000
	var err error
	k8s, err = client.New(fastCfg, client.Options{Scheme: cluster.Client.Scheme()})
	Expect(err).NotTo(HaveOccurred())

	nodes = startTracker(nodeResource, nodeLevel)
	vmis = startTracker(vmiResource, vmiDecision)
}, NodeTimeout(30*time.Minute))

// Then the cluster stops (suite.StartCluster).
var _ = AfterSuite(func(SpecContext) {
	printTable()
	if stopController != nil {
		stopController()
	}
}, NodeTimeout(2*time.Minute))

var _ = clustersuite.ReportLogsOnFailure(func() *testcluster.Cluster { return cluster })

// startController installs virt-rules' webhook configurations pointed at 127.0.0.1 and runs
// `virt-rules controller` with them, as a person would beside `make local-cluster`, until the
// suite ends (AfterSuite stops it). It returns once the controller is healthy and its webhooks serve.
func startController(binary string) {
	GinkgoHelper()
	webhooks := &envtest.WebhookInstallOptions{
		Paths:            []string{filepath.Join(repoRoot, "examples", "deploy", "webhooks")},
		LocalServingHost: "127.0.0.1",
	}
	Expect(webhooks.Install(cluster.Config)).To(Succeed())
	metricsAddr, probeAddr := clustersuite.FreeAddress(), clustersuite.FreeAddress()
	pprofAddr = clustersuite.FreeAddress()
	metricsURL = "http://" + metricsAddr + "/metrics"
	controller = exec.Command(binary, "controller", "--kubeconfig", cluster.Kubeconfig, "--leader-elect=false",
		"--webhook-cert-dir", webhooks.LocalServingCertDir, "--webhook-port", strconv.Itoa(webhooks.LocalServingPort),
		"--concurrent-syncs", strconv.Itoa(concurrentSyncs), "--node-label-workers", strconv.Itoa(nodeLabelWorkers),
		"--migration-policy-workers", strconv.Itoa(policyWorkers), "--log-level", "warn",
		"--metrics-bind-address", metricsAddr, "--metrics-insecure-http", "--health-probe-bind-address", probeAddr,
		"--pprof-bind-address", pprofAddr)
	// SCALE_POOL_PLAN_INTERVAL sets the controller's --pool-plan-interval (default: its own).
	if interval := os.Getenv("SCALE_POOL_PLAN_INTERVAL"); interval != "" {
		controller.Args = append(controller.Args, "--pool-plan-interval", interval)
	}
	log, err := os.Create(filepath.Join(cluster.Dir, "logs", "virt-rules-controller.log"))
	Expect(err).NotTo(HaveOccurred())
	controller.Stdout, controller.Stderr = log, log
	// The Deployment's soft memory limit, as the kit sets it.
	controller.Env = append(os.Environ(), "GOMEMLIMIT="+kitGOMEMLIMIT())
	Expect(controller.Start()).To(Succeed())
	controllerLog, controllerExited = log.Name(), make(chan struct{})
	go func() { _ = controller.Wait(); close(controllerExited) }()
	progress("virt-rules controller running, pid %d, log %s", controller.Process.Pid, log.Name())
	// It runs until the suite ends, not until the spec that started it does.
	stopController = func() {
		clustersuite.Terminate(controller.Process, controllerExited, 20*time.Second)
		Expect(log.Close()).To(Succeed())
		Expect(webhooks.Cleanup()).To(Succeed())
	}
	Eventually(func() int {
		controllerAlive()
		code, _ := httpGet("http://" + probeAddr + "/readyz")
		return code
	}).WithTimeout(time.Minute).Should(Equal(200))
	Eventually(func() string {
		controllerAlive()
		_, body := httpGet(metricsURL)
		return body
	}).WithTimeout(time.Minute).Should(ContainSubstring("controller_runtime_reconcile_total"))
}

// controllerAlive, called in a polled function, stops the polling with the end of the
// controller's log once its process has exited: every figure after that would be someone
// else's (a port it could not bind may be answered by another process).
func controllerAlive() {
	if msg := controllerDead(); msg != "" {
		StopTrying(msg).Now()
	}
}

// controllerDead is "" while the controller runs, else why it stopped: the end of its log.
func controllerDead() string {
	select {
	case <-controllerExited:
		tail, _ := os.ReadFile(controllerLog)
		return fmt.Sprintf("virt-rules controller exited: %s", tail[max(0, len(tail)-2000):])
	default:
		return ""
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// progress is a line for the person watching (`make scale` runs ginkgo -v).
func progress(format string, args ...any) {
	fmt.Fprintf(GinkgoWriter, "%s scale: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

// row is one line of the table: a measurement, and for a target its bound and verdict.
type row struct {
	what, figure, bound, verdict string
}

var (
	tableMu sync.Mutex
	table   []row
)

// measured records a figure without a bound.
func measured(what, format string, args ...any) {
	record(row{what: what, figure: fmt.Sprintf(format, args...), verdict: "info"})
}

// checks collects the verdicts of one spec's bounds; fail fails the spec if any was broken.
type checks struct{ broken []string }

// bound records a target: figure, the bound it is held to, PASS when ok.
func (c *checks) bound(what string, ok bool, bound, format string, args ...any) {
	r := row{what: what, figure: fmt.Sprintf(format, args...), bound: bound, verdict: "PASS"}
	if !ok {
		r.verdict = "FAIL"
		c.broken = append(c.broken, fmt.Sprintf("%s: %s, bound %s", what, r.figure, bound))
	}
	record(r)
}

func (c *checks) fail() {
	GinkgoHelper()
	Expect(c.broken).To(BeEmpty(), "bounds broken")
}

func record(r row) {
	tableMu.Lock()
	table = append(table, r)
	tableMu.Unlock()
	progress("%s: %s %s %s", r.what, r.figure, r.bound, r.verdict)
}

// printTable prints the table to stdout, one SCALE line per row, with the machine it ran on.
func printTable() {
	tableMu.Lock()
	defer tableMu.Unlock()
	w := 0
	for _, r := range table {
		w = max(w, len(r.what))
	}
	fmt.Fprintf(GinkgoWriter, "SCALE machine: %d CPUs, %s memory; %d nodes, %d VMIs, %d policies, %d pools of %d VMs, burst %d\n",
		numCPU(), memTotal(), numNodes, numVMIs, numPolicies, numPools, poolVMs, numBurst)
	for _, r := range table {
		line := fmt.Sprintf("SCALE %-*s | %s", w, r.what, r.figure)
		if r.bound != "" {
			line += " | bound: " + r.bound
		}
		fmt.Fprintln(GinkgoWriter, line+" | "+r.verdict)
	}
}

func numCPU() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// kitGOMEMLIMIT is the GOMEMLIMIT examples/deploy gives the controller's container.
func kitGOMEMLIMIT() string {
	GinkgoHelper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "examples", "deploy", "base", "controller.yaml"))
	Expect(err).NotTo(HaveOccurred())
	m := regexp.MustCompile(`- name: GOMEMLIMIT\s+value: (\S+)`).FindSubmatch(data)
	Expect(m).NotTo(BeNil(), "examples/deploy/base/controller.yaml sets no GOMEMLIMIT")
	return string(m[1])
}
