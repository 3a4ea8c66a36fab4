package testcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/internal/manifest"
)

// KubeVirt's ServiceAccounts, as virt-operator names them. virt-api's webhooks let only these
// users change a VMI's spec and its reserved kubevirt.io/ labels.
const (
	ControllerServiceAccount = "kubevirt-controller"
	APIServiceAccount        = "kubevirt-apiserver"
	HandlerServiceAccount    = "kubevirt-handler"
)

// GVKKubeVirt is the KubeVirt CR's kind; the cluster's CR is Namespace/KubeVirtName.
var GVKKubeVirt = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "KubeVirt"}

// KubeVirtName is the name of the cluster's KubeVirt CR.
const KubeVirtName = "kubevirt"

// startKubeVirt installs what virt-operator would and starts virt-controller, virt-api and the
// virt-handler stand-in.
func (c *Cluster) startKubeVirt(ctx context.Context, assets string, controllerArgs []string) error {
	oracle := filepath.Join(assets, "kubevirt-oracle")
	version, err := output(ctx, oracle, "version")
	if err != nil {
		return fmt.Errorf("kubevirt-oracle version: %w", err)
	}
	c.KubeVirtVersion = strings.TrimSpace(string(version))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if err := c.Client.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace %s: %w", Namespace, err)
	}

	apiAddr, err := freeAddr()
	if err != nil {
		return err
	}
	controllerAddr, err := freeAddr()
	if err != nil {
		return err
	}
	objs, err := install(ctx, assets, "https://"+apiAddr, c.ca.certFile)
	if err != nil {
		return err
	}
	var webhooks []*unstructured.Unstructured
	crds := 0
	for _, o := range objs {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			webhooks = append(webhooks, o.Unstructured) // once virt-api serves them
			continue
		case "CustomResourceDefinition":
			crds++
		}
		if err := c.Client.Create(ctx, o.Unstructured); err != nil {
			return fmt.Errorf("create %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	if err := c.waitEstablished(ctx, objs); err != nil {
		return err
	}
	if err := c.newClient(); err != nil {
		return err
	}
	c.log.Info("KubeVirt installed", "version", c.KubeVirtVersion, "crds", crds, "objects", len(objs)-len(webhooks))
	if err := c.createKubeVirtCR(ctx); err != nil {
		return err
	}
	// virt-api watches the CA virt-handler's client certificates are checked against.
	caPEM, err := readFile(c.ca.certFile)
	if err != nil {
		return err
	}
	caMap := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "kubevirt-ca"}, Data: map[string]string{"ca-bundle": string(caPEM)}}
	if err := c.Client.Create(ctx, caMap); err != nil {
		return fmt.Errorf("create ConfigMap kubevirt-ca: %w", err)
	}

	controllerKubeconfig, _, err := c.serviceAccountKubeconfig(ctx, ControllerServiceAccount)
	if err != nil {
		return err
	}
	apiKubeconfig, _, err := c.serviceAccountKubeconfig(ctx, APIServiceAccount)
	if err != nil {
		return err
	}
	_, handlerConfig, err := c.serviceAccountKubeconfig(ctx, HandlerServiceAccount)
	if err != nil {
		return err
	}
	controllerCert, controllerKey, err := c.ca.issue("virt-controller", "virt-controller."+Namespace+".svc")
	if err != nil {
		return err
	}
	apiCert, apiKey, err := c.ca.issue("virt-api", "virt-api."+Namespace+".svc", "virt-api."+Namespace+".svc")
	if err != nil {
		return err
	}
	// Images are names only: kwok runs no container, but virt-controller copies them into pods.
	args := append([]string{
		"--kubeconfig", controllerKubeconfig, "--listen", "127.0.0.1", "--port", portOf(controllerAddr),
		"--prom-cert-file", controllerCert, "--prom-key-file", controllerKey,
		"--launcher-image", "quay.io/kubevirt/virt-launcher:" + c.KubeVirtVersion,
		"--exporter-image", "quay.io/kubevirt/virt-exportserver:" + c.KubeVirtVersion,
	}, controllerArgs...)
	if _, err := c.startRestarted("virt-controller", filepath.Join(assets, "virt-controller"), args...); err != nil {
		return err
	}
	if _, err := c.startRestarted("virt-api", filepath.Join(assets, "virt-api"),
		"--kubeconfig", apiKubeconfig, "--listen", "127.0.0.1", "--port", portOf(apiAddr),
		"--tls-cert-file", apiCert, "--tls-key-file", apiKey,
		"--handler-cert-file", apiCert, "--handler-key-file", apiKey); err != nil {
		return err
	}
	httpc, err := c.httpClient()
	if err != nil {
		return err
	}
	if err := c.waitFor(ctx, 2*time.Minute, "virt-api /healthz", func(ctx context.Context) error {
		_, err := get(ctx, httpc, "https://"+apiAddr+"/healthz")
		return err
	}); err != nil {
		return err
	}
	for _, w := range webhooks {
		if err := c.Client.Create(ctx, w); err != nil {
			return fmt.Errorf("create %s %s: %w", w.GetKind(), w.GetName(), err)
		}
	}
	if err := c.waitFor(ctx, time.Minute, "virt-api's webhooks to be called", c.webhooksCalled); err != nil {
		return err
	}
	if err := c.waitFor(ctx, 2*time.Minute, "virt-controller to lead", func(ctx context.Context) error {
		body, err := get(ctx, httpc, "https://"+controllerAddr+"/leader")
		if err != nil {
			return err
		}
		if !strings.Contains(strings.ReplaceAll(string(body), " ", ""), `"leader":"true"`) {
			return fmt.Errorf("%w: %s", errNotYet, body)
		}
		return nil
	}); err != nil {
		return err
	}
	c.log.Info("KubeVirt running", "virt-api", apiAddr, "virt-controller", controllerAddr)
	return c.startStandIn(handlerConfig)
}

// createKubeVirtCR creates the KubeVirt CR and the status virt-operator would write:
// virt-controller and virt-api only use a CR whose status.phase is set, and default a VMI's
// architecture from status.defaultArchitecture.
func (c *Cluster) createKubeVirtCR(ctx context.Context) error {
	kv := &unstructured.Unstructured{}
	kv.SetGroupVersionKind(GVKKubeVirt)
	kv.SetNamespace(Namespace)
	kv.SetName(KubeVirtName)
	kv.Object["spec"] = map[string]any{"configuration": map[string]any{"developerConfiguration": map[string]any{"featureGates": []any{}}}}
	// Discovery serves a just-established CRD's kind a moment later.
	if err := c.waitFor(ctx, 30*time.Second, "KubeVirt's kind in discovery", func(ctx context.Context) error {
		return c.Client.Create(ctx, kv)
	}); err != nil {
		return fmt.Errorf("create KubeVirt %s/%s: %w", Namespace, KubeVirtName, err)
	}
	kv.Object["status"] = map[string]any{
		"phase":                   "Deployed",
		"defaultArchitecture":     "amd64",
		"observedKubeVirtVersion": c.KubeVirtVersion,
		"targetKubeVirtVersion":   c.KubeVirtVersion,
	}
	if err := c.Client.Status().Update(ctx, kv); err != nil {
		return fmt.Errorf("write status of KubeVirt %s/%s: %w", Namespace, KubeVirtName, err)
	}
	return nil
}

// waitEstablished waits for every CRD among objs to be Established.
func (c *Cluster) waitEstablished(ctx context.Context, objs []manifest.Object) error {
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		name := o.GetName()
		err := c.waitFor(ctx, time.Minute, "CRD "+name+" to be established", func(ctx context.Context) error {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				return err
			}
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
			return errNotYet
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// webhooksCalled is nil once kube-apiserver calls virt-api's validating webhook: a VMI
// without memory, created as a dry run, is refused by it.
func (c *Cluster) webhooksCalled(ctx context.Context) error {
	vmi := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "webhook-probe", "namespace": Namespace},
		"spec":     map[string]any{"domain": map[string]any{"devices": map[string]any{}}},
	}}
	err := c.Client.Create(ctx, vmi, client.DryRunAll)
	if err == nil {
		return errors.New("a VMI without memory was admitted")
	}
	if strings.Contains(err.Error(), "kubevirt.io") && strings.Contains(err.Error(), "denied the request") {
		return nil
	}
	return err
}

// httpClient trusts the cluster's CA, which signed virt-api's and virt-controller's certificates.
func (c *Cluster) httpClient() (*http.Client, error) {
	caPEM, err := readFile(c.ca.certFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

func get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return body, nil
}

// install is what KubeVirt's operator installs, as kubevirt-oracle of assets prints it, with the
// webhooks pointed at webhookURL and trusting the CA in caFile.
func install(ctx context.Context, assets, webhookURL, caFile string) ([]manifest.Object, error) {
	out, err := output(ctx, filepath.Join(assets, "kubevirt-oracle"), "install", "--namespace", Namespace,
		"--webhook-url", webhookURL, "--ca-file", caFile)
	if err != nil {
		return nil, fmt.Errorf("KubeVirt install manifests: %w", err)
	}
	objs, err := manifest.Parse("kubevirt-oracle install", bytes.NewReader(out))
	if err != nil {
		return nil, fmt.Errorf("KubeVirt install manifests: %w", err)
	}
	return objs, nil
}

// KubeVirtCRDs are the CustomResourceDefinitions virt-operator installs for the KubeVirt of
// kubevirtAssets (kubevirt-oracle install), for a control plane without KubeVirt's components.
func KubeVirtCRDs(ctx context.Context, kubevirtAssets string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	ca, err := os.CreateTemp("", "kubevirt-oracle-ca-")
	if err != nil {
		return nil, fmt.Errorf("KubeVirt CRDs: %w", err)
	}
	defer os.Remove(ca.Name())
	ca.Close()
	// The webhooks are not used; install wants somewhere to point them.
	objs, err := install(ctx, kubevirtAssets, "https://127.0.0.1:1", ca.Name())
	if err != nil {
		return nil, err
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, crd); err != nil {
			return nil, fmt.Errorf("KubeVirt CRD %s: %w", o.GetName(), err)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}
