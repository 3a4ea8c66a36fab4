// Command localcluster runs the integration suite's control plane for a developer: a real
// etcd and kube-apiserver (hack/control-plane.sh's binaries), the CustomResourceDefinitions of
// examples/deploy/crds and the webhook configurations of examples/deploy/webhooks pointed at
// this machine, until interrupted. It writes an admin kubeconfig and prints the
// `virt-rules controller` command line that serves it.
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

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func main() {
	dir := flag.String("dir", ".local", "`DIR` for the kubeconfig (and the control plane's data while it runs)")
	assets := flag.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "`DIR` with etcd and kube-apiserver (default $KUBEBUILDER_ASSETS)")
	port := flag.Int("webhook-port", 9443, "port the webhook configurations point at on 127.0.0.1")
	flag.Parse()
	if err := run(*dir, *assets, *port); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run(dir, assets string, port int) error {
	if assets == "" {
		return errors.New("no control plane binaries: set --assets or KUBEBUILDER_ASSETS (make local-cluster does)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join("examples", "deploy", "crds")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths:            []string{filepath.Join("examples", "deploy", "webhooks")},
			LocalServingHost: "127.0.0.1",
			LocalServingPort: port,
		},
	}
	if _, err := env.Start(); err != nil {
		return fmt.Errorf("start etcd and kube-apiserver from %s: %w", assets, err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			slog.Error("stop control plane", "err", err)
		}
	}()
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add admin user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("render kubeconfig: %w", err)
	}
	path, err := filepath.Abs(filepath.Join(dir, "kubeconfig"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	fmt.Printf(`control plane up: kube-apiserver %s, CRDs and webhook configurations installed.
kubeconfig: %s
run the controller against it (webhooks included) with:

  bin/virt-rules controller --kubeconfig %s --leader-elect=false \
    --webhook-cert-dir %s --webhook-port %d --metrics-bind-address 127.0.0.1:8080 --health-probe-bind-address 127.0.0.1:8081

Ctrl-C stops the control plane and removes its data.
`, env.ControlPlane.APIServer.SecureServing.ListenAddr.HostPort(), path, path, env.WebhookInstallOptions.LocalServingCertDir, port)
	<-ctx.Done()
	return nil
}
