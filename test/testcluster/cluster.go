// Package testcluster starts a KubeVirt test cluster minus the hypervisor on this machine, every
// piece a real binary built from the Go module proxy (hack/control-plane.sh, hack/kubevirt.sh):
//
//   - etcd and kube-apiserver (through controller-runtime's envtest), with the aggregation
//     layer's request-header authentication virt-api requires;
//   - kube-scheduler, and kube-controller-manager (node lifecycle, garbage collection, service
//     accounts, disruption budgets, ...);
//   - kwok, the kubelet of every node labelled as virt-handler's node labeller and device
//     plugins would: pods are scheduled and reach Running;
//   - KubeVirt's own virt-controller and virt-api, with the CRDs, RBAC, ValidatingAdmission-
//     Policies and webhook configurations virt-operator's install strategy generates (printed
//     by kubevirt-oracle, built from KubeVirt's module), each component authenticated as its
//     own ServiceAccount;
//   - the virt-handler stand-in (StandIn), the only simulated KubeVirt piece.
//
// The integration suites start one with Start; `make local-cluster` starts one for a person.
package testcluster

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Namespace is where KubeVirt runs, as virt-controller and virt-api assume outside a pod.
const Namespace = "kubevirt"

// The binaries each assets folder must hold.
var (
	controlPlaneBinaries = []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}
	kubevirtBinaries     = []string{"virt-controller", "virt-api", "kwok", "kubevirt-oracle"}
)

// Options say where the binaries are and what the cluster starts with.
type Options struct {
	// ControlPlaneAssets holds etcd, kube-apiserver, kube-scheduler and kube-controller-manager
	// (the folder hack/control-plane.sh prints).
	ControlPlaneAssets string
	// KubeVirtAssets holds virt-controller, virt-api, kwok and kubevirt-oracle (the folder
	// hack/kubevirt.sh prints).
	KubeVirtAssets string
	// Dir keeps the cluster's logs, certificates, kubeconfigs and etcd data. Empty: a temporary
	// folder, removed by Stop.
	Dir string
	// Nodes are created, and Ready, when Start returns. Node gives one as virt-handler would
	// have labelled it.
	Nodes []*corev1.Node
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
	// KubeAPIQPS, when set, is kube-scheduler's and kube-controller-manager's --kube-api-qps
	// (burst twice that) instead of their defaults (50 and 20 a second), for clusters of
	// thousands of nodes and pods.
	KubeAPIQPS int
	// StopTimeout bounds how long etcd and kube-apiserver each get to stop after SIGTERM
	// (default 1 minute). kube-apiserver drains in-flight requests first, which a cluster
	// that served thousands of objects may need longer for.
	StopTimeout time.Duration
	// NodeLeaseDuration is the Lease duration kwok gives its nodes (default 40 s, the
	// kubelet's); kwok renews each Lease every quarter of it. A longer one keeps a cluster of
	// thousands of nodes from spending the API server on heartbeats (5,000 nodes at 40 s are
	// 500 Lease writes a second); kube-controller-manager then waits twice as long before it
	// calls a node unreachable.
	NodeLeaseDuration time.Duration
	// Controllers are kube-controller-manager's controllers to run besides the ones every
	// cluster runs (kubeControllers), e.g. job-controller where a suite creates Jobs. kwok
	// completes a Job's pod on its nodes without running it: a suite that needs the pod to
	// run plays its kubelet.
	Controllers []string
	// VirtControllerArgs are added to virt-controller's command line, e.g.
	// --vm-controller-threads for a cluster of thousands of VMs (its default, 3 VMs synced at
	// a time, makes a few VMIs a second when each create passes virt-api's webhooks).
	VirtControllerArgs []string
	// RealNodes starts kube-apiserver and kube-controller-manager as real nodes (AddRealNode)
	// and their pods need them: kubelets reached by InternalIP with a client certificate,
	// Services resolved to endpoints, ServiceAccount tokens (configureForRealNodes). Off by
	// default, which leaves every other suite's cluster as it was.
	RealNodes bool
}

// Cluster is a running test cluster. Stop ends every process Start began.
type Cluster struct {
	// Dir keeps logs/ (one file per process), pki/, and the kubeconfigs.
	Dir string
	// Config reaches kube-apiserver as an admin (system:masters).
	Config *rest.Config
	// Kubeconfig is the admin kubeconfig file, for kubectl and `virt-rules controller`.
	Kubeconfig string
	// Client is an admin client knowing client-go's kinds and CRDs; KubeVirt's kinds go
	// through *unstructured.Unstructured.
	Client client.Client
	// KubeVirtVersion is the version of virt-controller and virt-api (kubevirt-oracle version).
	KubeVirtVersion string
	// StandIn is the virt-handler stand-in, running.
	StandIn *StandIn

	env       *envtest.Environment
	ca        *authority
	procs     []*process
	log       *slog.Logger
	removeDir bool
	envLogs   []*os.File // etcd's and kube-apiserver's logs, closed by Stop
	stopStand context.CancelFunc
	standDone chan struct{}
	// realNodes is Options.RealNodes: whether kube-apiserver can reach real nodes' kubelets.
	realNodes bool
}

// Start starts every piece and returns once KubeVirt admits and runs VMs: the CRDs are
// established, virt-controller leads, virt-api serves its webhooks and every node is Ready.
// On error, whatever was started is stopped.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if err := checkAssets(o.ControlPlaneAssets, "ControlPlaneAssets (hack/control-plane.sh)", controlPlaneBinaries); err != nil {
		return nil, err
	}
	if err := checkAssets(o.KubeVirtAssets, "KubeVirtAssets (hack/kubevirt.sh)", kubevirtBinaries); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: o.Dir, log: o.Logger, realNodes: o.RealNodes}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "virt-rules-cluster-"); err != nil {
			return nil, fmt.Errorf("start test cluster: %w", err)
		}
		c.removeDir = true
	}
	defer func() {
		if err != nil {
			if stopErr := c.Stop(); stopErr != nil {
				c.log.Error("stop half-started test cluster", "err", stopErr)
			}
		}
	}()
	for _, d := range []string{"logs", "pki"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("start test cluster: %w", err)
		}
	}
	began := time.Now()
	if c.ca, err = newAuthority(filepath.Join(c.Dir, "pki")); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(o.ControlPlaneAssets, cmp.Or(o.StopTimeout, time.Minute)); err != nil {
		return nil, err
	}
	c.log.Info("kube-apiserver ready", "host", c.Config.Host, "elapsed", time.Since(began).Round(time.Millisecond))
	if err := c.startKubernetes(o.ControlPlaneAssets, o.KubeVirtAssets, o.KubeAPIQPS, cmp.Or(o.NodeLeaseDuration, 40*time.Second), o.Controllers); err != nil {
		return nil, err
	}
	if err := c.startKubeVirt(ctx, o.KubeVirtAssets, o.VirtControllerArgs); err != nil {
		return nil, err
	}
	if err := c.CreateNodes(ctx, o.Nodes...); err != nil {
		return nil, err
	}
	c.log.Info("test cluster up", "kubevirt", c.KubeVirtVersion, "nodes", len(o.Nodes), "elapsed", time.Since(began).Round(time.Millisecond), "dir", c.Dir)
	return c, nil
}

func checkAssets(dir, what string, binaries []string) error {
	if dir == "" {
		return fmt.Errorf("start test cluster: %s not set", what)
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("start test cluster: %s: %w", what, err)
		}
	}
	return nil
}

// startAPIServer starts etcd and kube-apiserver and writes the admin kubeconfig.
func (c *Cluster) startAPIServer(assets string, stopTimeout time.Duration) error {
	frontProxyCert, frontProxyKey, err := c.ca.issue("front-proxy-client", "front-proxy-client")
	if err != nil {
		return err
	}
	c.env = &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  stopTimeout,
	}
	etcdLog, err := c.logFile("etcd")
	if err != nil {
		return err
	}
	apiLog, err := c.logFile("kube-apiserver")
	if err != nil {
		return err
	}
	c.env.ControlPlane.Etcd = &envtest.Etcd{Out: etcdLog, Err: etcdLog}
	c.env.ControlPlane.Etcd.Configure().Set("unsafe-no-fsync", "true")
	api := c.env.ControlPlane.GetAPIServer()
	api.Out, api.Err = apiLog, apiLog
	api.Configure().
		// virt-api reads the aggregation layer's request-header CA at start and refuses to run
		// without it.
		Set("requestheader-client-ca-file", c.ca.certFile).
		Set("requestheader-allowed-names", "front-proxy-client").
		Set("requestheader-username-headers", "X-Remote-User").
		Set("requestheader-group-headers", "X-Remote-Group").
		Set("requestheader-extra-headers-prefix", "X-Remote-Extra-").
		Set("proxy-client-cert-file", frontProxyCert).
		Set("proxy-client-key-file", frontProxyKey).
		// The default reconciler writes the loopback address into Endpoints every 10 s and logs
		// that it is invalid.
		Set("endpoint-reconciler-type", "none")
	if c.realNodes {
		if err := c.configureForRealNodes(api); err != nil {
			return err
		}
	}
	if c.Config, err = c.env.Start(); err != nil {
		return fmt.Errorf("start etcd and kube-apiserver from %s: %w", assets, err)
	}
	admin, err := c.env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add admin user: %w", err)
	}
	c.Config = admin.Config()
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		return fmt.Errorf("render admin kubeconfig: %w", err)
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kubeconfig, 0o600); err != nil {
		return fmt.Errorf("write admin kubeconfig: %w", err)
	}
	return c.newClient()
}

// newClient (re)makes Client; a new one discovers kinds whose CRDs were created since.
func (c *Cluster) newClient() error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return err
	}
	cl, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	c.Client = cl
	return nil
}

// kubeControllers are kube-controller-manager's controllers a KubeVirt cluster without cloud,
// storage or services needs.
var kubeControllers = []string{
	"node-lifecycle-controller", "taint-eviction-controller", "garbage-collector-controller",
	"namespace-controller", "serviceaccount-controller", "root-ca-certificate-publisher-controller",
	"pod-garbage-collector-controller", "disruption-controller", "clusterrole-aggregation-controller",
	"deployment-controller", "replicaset-controller",
}

// startKubernetes starts kube-scheduler, kube-controller-manager and kwok, all as the admin.
func (c *Cluster) startKubernetes(controlPlane, kubevirt string, qps int, lease time.Duration, controllers []string) error {
	api := c.env.ControlPlane.GetAPIServer()
	var rate []string
	if qps > 0 {
		rate = []string{"--kube-api-qps", strconv.Itoa(qps), "--kube-api-burst", strconv.Itoa(2 * qps)}
	}
	leaseSeconds := int(lease.Seconds())
	var grace []string
	if leaseSeconds > 40 {
		// Thousands of kwok nodes: kwok's Lease renewals fall behind under load (a full make
		// scale saw a Lease 12 minutes old on a node whose Ready heartbeat was seconds old),
		// the node lifecycle controller calls such nodes unreachable, and its NoExecute taint
		// evicted 21 launcher pods of healthy simulated nodes (their VMIs Failed). Without
		// eviction the unreachable taint only keeps new pods off them, as it should.
		grace = []string{"--node-monitor-grace-period", (2 * lease).String(),
			"--node-eviction-rate", "0", "--secondary-node-eviction-rate", "0"}
	}
	apiCA := filepath.Join(c.Dir, "pki", "apiserver-ca.crt")
	rootCA, err := c.rootCA()
	if err != nil {
		return err
	}
	if err := os.WriteFile(apiCA, rootCA, 0o600); err != nil {
		return fmt.Errorf("write kube-apiserver CA: %w", err)
	}
	kc := c.Kubeconfig
	if _, err := c.start("kube-scheduler", filepath.Join(controlPlane, "kube-scheduler"),
		append([]string{"--kubeconfig", kc, "--leader-elect=false", "--secure-port=0"}, rate...)...); err != nil {
		return err
	}
	// The node lifecycle controller must run: kube-apiserver taints every new node not-ready
	// and only that controller lifts the taint once kwok reports the node Ready.
	if _, err := c.start("kube-controller-manager", filepath.Join(controlPlane, "kube-controller-manager"),
		append([]string{"--kubeconfig", kc, "--leader-elect=false", "--secure-port=0",
			"--service-account-private-key-file", filepath.Join(api.CertDir, "sa-signer.key"),
			"--root-ca-file", apiCA, "--use-service-account-credentials=false",
			"--controllers=" + strings.Join(append(slices.Clone(kubeControllers), controllers...), ",")}, append(rate, grace...)...)...); err != nil {
		return err
	}
	stages, err := kwokStages(kubevirt)
	if err != nil {
		return err
	}
	stagesFile := filepath.Join(c.Dir, "kwok-stages.yaml")
	if err := os.WriteFile(stagesFile, stages, 0o644); err != nil {
		return fmt.Errorf("write kwok stages: %w", err)
	}
	kwokAddr, err := freeAddr()
	if err != nil {
		return err
	}
	_, err = c.start("kwok", filepath.Join(kubevirt, "kwok"),
		"--kubeconfig", kc, "--config", stagesFile, "--v", "WARN",
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector", KwokNodeAnnotation+"=fake",
		"--server-address", kwokAddr, "--cidr", "10.244.0.1/16", "--node-ip", "10.1.0.1",
		"--node-lease-duration-seconds", strconv.Itoa(leaseSeconds))
	return err
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as ServiceAccount
// Namespace/name with a token from the TokenRequest API, as a component in a pod would.
func (c *Cluster) serviceAccountKubeconfig(ctx context.Context, name string) (string, *rest.Config, error) {
	token, err := c.token(ctx, name)
	if err != nil {
		return "", nil, err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	kc.CurrentContext = "test"
	path := filepath.Join(c.Dir, "kubeconfig-"+name)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", nil, fmt.Errorf("write kubeconfig of %s: %w", name, err)
	}
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = token
	return path, cfg, nil
}

// token is a token of ServiceAccount Namespace/name, valid for two days.
func (c *Cluster) token(ctx context.Context, name string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name}}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(48 * 3600))}}
	if err := c.Client.SubResource("token").Create(ctx, sa, req); err != nil {
		return "", fmt.Errorf("token of ServiceAccount %s/%s: %w", Namespace, name, err)
	}
	return req.Status.Token, nil
}

func readFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

// Stop ends the stand-in and every process, newest first, then etcd and kube-apiserver, and
// removes Dir if Start made it. It returns every failure.
func (c *Cluster) Stop() error {
	var errs []error
	if c.stopStand != nil {
		c.stopStand()
		<-c.standDone
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		errs = append(errs, c.procs[i].stop(10*time.Second))
	}
	c.procs = nil
	if c.env != nil {
		began := time.Now()
		err := c.env.Stop()
		c.log.Info("kube-apiserver and etcd stopped", "elapsed", time.Since(began).Round(time.Millisecond), "err", err)
		errs = append(errs, err)
		c.env = nil
	}
	for _, f := range c.envLogs {
		errs = append(errs, f.Close())
	}
	c.envLogs = nil
	if c.removeDir && errors.Join(errs...) == nil {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	return errors.Join(errs...)
}

// Logs is the tail of every process's log, newest lines last, for a failing test's report.
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	files := append([]*os.File(nil), c.envLogs...)
	for _, p := range c.procs {
		files = append(files, p.log)
	}
	for _, f := range files {
		data, err := os.ReadFile(f.Name())
		if err != nil {
			continue
		}
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(all) > lines {
			all = all[len(all)-lines:]
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n", f.Name(), strings.Join(all, "\n"))
	}
	return b.String()
}

// freeAddr is a 127.0.0.1 address with a port nothing listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// output runs a binary to completion and returns its stdout; stderr goes into the error.
func output(ctx context.Context, bin string, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
