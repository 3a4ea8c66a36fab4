package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeBinaries are what RealNodeOptions.Assets must hold (the folder hack/node.sh prints).
var NodeBinaries = []string{"kubelet"}

// The Debian packages' binaries a real node runs (hack/node.sh installs them).
const (
	containerdBin = "/usr/bin/containerd"
	ctrBin        = "/usr/bin/ctr"
	runcBin       = "/usr/sbin/runc"
	// cniBinDir is where Debian's containernetworking-plugins puts the plugins (upstream's
	// /opt/cni/bin is empty).
	cniBinDir = "/usr/lib/cni"
)

// RealNodeOptions say what a real node is called and what it starts with.
type RealNodeOptions struct {
	// Name is the Node's name, and kubelet's --hostname-override.
	Name string
	// Assets holds kubelet (the folder hack/node.sh prints).
	Assets string
	// Images are OCI image layouts (as `make images` writes them, bin/images/controller) the
	// node's containerd imports before kubelet starts: the test cluster pulls nothing, so a
	// pod's image must be one of them, with imagePullPolicy Never or IfNotPresent.
	Images []string
	// PodCIDR is the node's pod network (default 10.88.0.0/24); two real nodes need two.
	PodCIDR string
	// KubeletPort is kubelet's HTTPS port (default 10350) and KubeletPort+1 its healthz port;
	// two real nodes need two.
	KubeletPort int
}

// RealNode is a real kubelet and containerd, Ready as a Node of the cluster: its pods' containers
// run (runc, a CNI bridge of its own), their logs are read through the API server as kubectl
// logs reads them. Stop removes it.
type RealNode struct {
	// Name is the Node's name.
	Name string
	// Dir keeps containerd's root, state and socket, kubelet's root and configuration, and the
	// CNI configuration, under the cluster's Dir.
	Dir string
	// Images are the references the imported images have in containerd, each as the CRI looks
	// it up (docker.io/ added to a name without a registry).
	Images []string
	// IP is the node's InternalIP, where kubelet listens.
	IP net.IP

	cluster    *Cluster
	socket     string
	bridge     string
	containerd *process
	kubelet    *process
	// dnat is the iptables rule (nat table) that sends the pods' connections to the
	// kubernetes Service to proxy, nil until added.
	dnat []string
	// proxy is the kubernetes Service's stand-in the rule sends them to.
	proxy   *apiProxy
	stopped bool
}

// AddRealNode starts containerd and kubelet as node o.Name of the cluster, which Start must
// have been given RealNodes, and returns once the Node is Ready. It needs root, as any kubelet
// does. On error, whatever was started is stopped.
func (c *Cluster) AddRealNode(ctx context.Context, o RealNodeOptions) (_ *RealNode, err error) {
	if err := c.checkRealNode(o); err != nil {
		return nil, err
	}
	n := &RealNode{Name: o.Name, Dir: filepath.Join(c.Dir, "nodes", o.Name), cluster: c, bridge: bridgeName(o.Name)}
	n.socket = filepath.Join(n.Dir, "containerd.sock")
	defer func() {
		if err != nil {
			if stopErr := n.Stop(context.WithoutCancel(ctx)); stopErr != nil {
				c.log.Error("stop half-started real node", "node", o.Name, "err", stopErr)
			}
		}
	}()
	began := time.Now()
	pause, err := buildPauseImage(ctx, filepath.Join(n.Dir, "pause"))
	if err != nil {
		return nil, err
	}
	if n.IP, err = hostIP(); err != nil {
		return nil, err
	}
	if err := n.writeConfig(o); err != nil {
		return nil, err
	}
	if n.proxy, err = c.startAPIProxy(); err != nil {
		return nil, err
	}
	if err := n.setUpNetwork(ctx); err != nil {
		return nil, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	if n.Images, err = n.importImages(ctx, append([]string{pause}, o.Images...)); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx, o.Assets); err != nil {
		return nil, err
	}
	c.log.Info("real node Ready", "node", n.Name, "images", n.Images, "elapsed", time.Since(began).Round(time.Millisecond))
	return n, nil
}

func (c *Cluster) checkRealNode(o RealNodeOptions) error {
	if !c.realNodes {
		return fmt.Errorf("add real node %s: the test cluster was not started with RealNodes", o.Name)
	}
	if o.Name == "" {
		return errors.New("add real node: no name")
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("add real node %s: kubelet and containerd need root", o.Name)
	}
	if err := checkAssets(o.Assets, "RealNodeOptions.Assets (hack/node.sh)", NodeBinaries); err != nil {
		return fmt.Errorf("add real node %s: %w", o.Name, err)
	}
	for _, bin := range []string{containerdBin, ctrBin, runcBin, filepath.Join(cniBinDir, "bridge"), filepath.Join(cniBinDir, "host-local")} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("add real node %s: %w (hack/node.sh installs containerd, runc and containernetworking-plugins)", o.Name, err)
		}
	}
	// The node's bridge and its DNAT rule (setUpNetwork).
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("add real node %s: %w", o.Name, err)
		}
	}
	return nil
}

// startContainerd starts containerd on the node's configuration and waits until it answers on
// its socket.
func (n *RealNode) startContainerd(ctx context.Context) error {
	var err error
	n.containerd, err = n.cluster.start(n.Name+"-containerd", containerdBin, "--config", filepath.Join(n.Dir, "containerd.toml"))
	if err != nil {
		return err
	}
	return n.cluster.waitFor(ctx, time.Minute, "containerd of "+n.Name, func(ctx context.Context) error {
		_, err := n.ctr(ctx, "version")
		return err
	})
}

// startKubelet starts kubelet and waits until its Node is Ready.
func (n *RealNode) startKubelet(ctx context.Context, assets string) error {
	var err error
	n.kubelet, err = n.cluster.start(n.Name+"-kubelet", filepath.Join(assets, "kubelet"),
		"--config", filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig", n.cluster.Kubeconfig,
		"--root-dir", filepath.Join(n.Dir, "kubelet"),
		"--hostname-override", n.Name,
		"--node-ip", n.IP.String(),
		"--v", "2")
	if err != nil {
		return err
	}
	return n.cluster.waitFor(ctx, 2*time.Minute, "Node "+n.Name+" Ready", func(ctx context.Context) error {
		node := &corev1.Node{}
		if err := n.cluster.Client.Get(ctx, client.ObjectKey{Name: n.Name}, node); err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errNotYet
	})
}

// hostIP is the first global IPv4 address of an interface that is up: the address kubelet
// would pick as the node's InternalIP (it refuses a loopback one), where it listens for the
// API server.
func hostIP() (net.IP, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", iface.Name, err)
		}
		for _, a := range addrs {
			if ipNet, ok := a.(*net.IPNet); ok && ipNet.IP.To4() != nil && ipNet.IP.IsGlobalUnicast() {
				return ipNet.IP.To4(), nil
			}
		}
	}
	return nil, errors.New("find the node's IP: no interface up has a global IPv4 address")
}

// Stop removes the node: its pods are deleted through the API server (the node cordoned first,
// so that their controllers' replacements go elsewhere) and stopped by kubelet, which then
// stops; whatever containers are left are killed through containerd, which stops too; what
// they mounted, their network namespaces and the CNI bridge are removed, then the Node. It
// returns every failure; a second call does nothing.
func (n *RealNode) Stop(ctx context.Context) error {
	if n.stopped {
		return nil
	}
	n.stopped = true
	var errs []error
	if n.kubelet != nil && n.kubelet.exited() == nil {
		errs = append(errs, n.drain(ctx))
	}
	if n.kubelet != nil {
		errs = append(errs, n.kubelet.stop(30*time.Second))
	}
	var leftovers []container
	if n.containerd != nil && n.containerd.exited() == nil {
		var err error
		leftovers, err = n.removeContainers(ctx)
		errs = append(errs, err)
	}
	errs = append(errs, n.killShims())
	if n.containerd != nil {
		errs = append(errs, n.containerd.stop(30*time.Second))
	}
	// Gone for good, they must not fail the cluster's waits (waitFor) from now on.
	n.cluster.procs = slices.DeleteFunc(n.cluster.procs, func(p *process) bool { return p == n.kubelet || p == n.containerd })
	errs = append(errs, n.removeHostState(leftovers))
	errs = append(errs, n.tearDownNetwork(ctx))
	if n.proxy != nil {
		errs = append(errs, n.proxy.stop())
	}
	errs = append(errs, n.deleteNode(ctx))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop real node %s: %w", n.Name, err)
	}
	n.cluster.log.Info("real node stopped", "node", n.Name)
	return nil
}

// drain cordons the node, deletes its pods and waits, a minute at most, until kubelet has
// stopped them and the API server has none left on it.
func (n *RealNode) drain(ctx context.Context) error {
	c := n.cluster.Client
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: n.Name}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	patch := client.MergeFrom(node.DeepCopy())
	node.Spec.Unschedulable = true
	if err := c.Patch(ctx, node, patch); err != nil {
		return fmt.Errorf("cordon %s: %w", n.Name, err)
	}
	return n.cluster.waitFor(ctx, time.Minute, "pods of "+n.Name+" gone", func(ctx context.Context) error {
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.MatchingFields{"spec.nodeName": n.Name}); err != nil {
			return err
		}
		for i := range pods.Items {
			if pods.Items[i].DeletionTimestamp != nil {
				continue
			}
			// A second's grace: kubelet stops the containers and confirms, unlike a forced
			// delete, which would leave them running.
			err := c.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(1))
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete pod %s/%s: %w", pods.Items[i].Namespace, pods.Items[i].Name, err)
			}
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left: %w", len(pods.Items), errNotYet)
		}
		return nil
	})
}

// deleteNode deletes the Node, which kubelet no longer keeps.
func (n *RealNode) deleteNode(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	err := n.cluster.Client.Delete(ctx, node, &client.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Node %s: %w", n.Name, err)
	}
	return nil
}
