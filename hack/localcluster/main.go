// Command localcluster runs the test cluster for a person: KubeVirt minus the hypervisor
// (test/testcluster: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
// nodes, KubeVirt's own virt-controller and virt-api, the virt-handler stand-in), plus
// virt-rules' own CRDs (the VirtualMachinePool of pool.virt-rules.io) and webhook
// configurations pointed at this machine, until interrupted. It writes an admin kubeconfig and
// prints the `virt-rules controller` command line that serves the cluster.
//
//	make local-cluster    # then, in another terminal, the command it prints
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/test/testcluster"
)

func main() {
	dir := flag.String("dir", ".local", "`DIR` for the kubeconfig, logs and the cluster's data while it runs")
	controlPlane := flag.String("control-plane-assets", os.Getenv("KUBEBUILDER_ASSETS"), "`DIR` with etcd, kube-apiserver, kube-scheduler, kube-controller-manager (default $KUBEBUILDER_ASSETS)")
	kubevirt := flag.String("kubevirt-assets", os.Getenv("KUBEVIRT_ASSETS"), "`DIR` with virt-controller, virt-api, kwok, kubevirt-oracle (default $KUBEVIRT_ASSETS)")
	nodes := flag.Int("nodes", 3, "kwok nodes to create, labelled as virt-handler would")
	port := flag.Int("webhook-port", 9443, "port virt-rules' webhook configurations point at on 127.0.0.1")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, *dir, *controlPlane, *kubevirt, *nodes, *port); err != nil {
		log.Error("local cluster failed", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, dir, controlPlane, kubevirt string, nodes, port int) error {
	if controlPlane == "" || kubevirt == "" {
		return errors.New("no binaries: set --control-plane-assets and --kubevirt-assets (make local-cluster does)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	var ns []*corev1.Node
	for i := range nodes {
		ns = append(ns, testcluster.Node(fmt.Sprintf("node-%d", i+1), testcluster.Skylake,
			map[string]string{"topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%2)}))
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cluster, err := testcluster.Start(startCtx, testcluster.Options{
		ControlPlaneAssets: controlPlane, KubeVirtAssets: kubevirt, Dir: dir, Nodes: ns, Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			log.Error("stop cluster", "err", err)
		}
	}()
	if _, err := envtest.InstallCRDs(cluster.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("examples", "deploy", "crds", "pool.virt-rules.io_virtualmachinepools.yaml")}, ErrorIfPathMissing: true,
	}); err != nil {
		return fmt.Errorf("install virt-rules' CRDs: %w", err)
	}
	webhooks := &envtest.WebhookInstallOptions{
		Paths:            []string{filepath.Join("examples", "deploy", "webhooks")},
		LocalServingHost: "127.0.0.1",
		LocalServingPort: port,
	}
	if err := webhooks.Install(cluster.Config); err != nil {
		return fmt.Errorf("install virt-rules' webhook configurations: %w", err)
	}
	// envtest writes the serving certificate to a temporary folder: keep it beside the
	// kubeconfig, where the printed command line finds it.
	certs := filepath.Join(dir, "webhook-certs")
	err = os.CopyFS(certs, os.DirFS(webhooks.LocalServingCertDir))
	if cleanupErr := webhooks.Cleanup(); err == nil {
		err = cleanupErr
	}
	if err != nil {
		return fmt.Errorf("keep the webhook serving certificate in %s: %w", certs, err)
	}
	fmt.Printf(`KubeVirt %s test cluster up: %d kwok nodes; logs in %s/logs.

  export KUBECONFIG=%s
  kubectl get nodes,kubevirt -A

Run virt-rules beside KubeVirt (webhooks included) with:

  bin/virt-rules controller --kubeconfig %s --leader-elect=false \
    --webhook-cert-dir %s --webhook-port %d --metrics-bind-address 127.0.0.1:8080 --health-probe-bind-address 127.0.0.1:8081

Ctrl-C stops the cluster.
`, cluster.KubeVirtVersion, nodes, dir, cluster.Kubeconfig, cluster.Kubeconfig, certs, port)
	<-ctx.Done()
	return nil
}
