//go:build virtrules_oracle

// Command kubevirt-oracle answers from KubeVirt's own code, so that virt-rules' tests have an
// oracle no one in this project wrote. It is built by hack/kubevirt.sh inside a copy of the
// kubevirt.io/kubevirt module at the version the test cluster runs (the build tag keeps it out
// of virt-rules' own module), never committed as a binary.
//
//	kubevirt-oracle version
//	kubevirt-oracle install --webhook-url https://127.0.0.1:PORT --ca-file CA.crt [--namespace kubevirt]
//
// install prints, as one YAML stream, what virt-operator's install strategy would create for
// virt-api and virt-controller to run: every CustomResourceDefinition (and the KubeVirt CRD
// virt-operator's own manifest brings), the ServiceAccounts,
// RBAC and ValidatingAdmissionPolicies, and virt-api's mutating and validating webhook
// configurations with each webhook's Service replaced by the URL virt-api listens on (the test
// cluster's kube-apiserver has no cluster network) and the given CA bundle.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/install"
	operatorutil "kubevirt.io/kubevirt/pkg/virt-operator/util"
)

// kubevirtVersion is stamped by hack/kubevirt.sh (-X main.kubevirtVersion=...).
var kubevirtVersion = "unknown"

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kubevirt-oracle:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: kubevirt-oracle version | install --webhook-url URL --ca-file FILE [--namespace NS]")
	}
	switch args[0] {
	case "version":
		_, err := fmt.Fprintln(out, kubevirtVersion)
		return err
	case "install":
		return installCmd(args[1:], out)
	default:
		return fmt.Errorf("unknown command %q", args[0])
	}
}

func installCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	namespace := fs.String("namespace", "kubevirt", "KubeVirt's install namespace")
	webhookURL := fs.String("webhook-url", "", "base URL virt-api serves its webhooks at")
	caFile := fs.String("ca-file", "", "PEM CA bundle that signed virt-api's serving certificate")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *webhookURL == "" || *caFile == "" {
		return errors.New("install: --webhook-url and --ca-file are required")
	}
	ca, err := os.ReadFile(*caFile)
	if err != nil {
		return fmt.Errorf("install: read CA bundle: %w", err)
	}
	// virt-operator derives image names from its own image; nothing here pulls them.
	if os.Getenv(operatorutil.VirtOperatorImageEnvName) == "" {
		os.Setenv(operatorutil.VirtOperatorImageEnvName, "quay.io/kubevirt/virt-operator:"+kubevirtVersion)
	}
	kv := &v1.KubeVirt{}
	kv.Namespace = *namespace
	strategy, err := install.GenerateCurrentInstallStrategy(operatorutil.GetTargetConfigFromKV(kv), "", *namespace)
	if err != nil {
		return fmt.Errorf("install: generate KubeVirt's install strategy: %w", err)
	}

	var objs []any
	add := func(gvk schema.GroupVersionKind, o interface{ GetObjectKind() schema.ObjectKind }) {
		o.GetObjectKind().SetGroupVersionKind(gvk)
		objs = append(objs, o)
	}
	// The KubeVirt CRD is not in the install strategy: it comes with virt-operator's own
	// manifest, from the same generator.
	kubevirtCRD, err := components.NewKubeVirtCrd()
	if err != nil {
		return fmt.Errorf("install: generate the KubeVirt CRD: %w", err)
	}
	for _, o := range append(strategy.CRDs(), kubevirtCRD) {
		add(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}, o)
	}
	for _, o := range strategy.ServiceAccounts() {
		add(schema.GroupVersionKind{Version: "v1", Kind: "ServiceAccount"}, o)
	}
	rbac := func(kind string) schema.GroupVersionKind {
		return schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: kind}
	}
	for _, o := range strategy.ClusterRoles() {
		add(rbac("ClusterRole"), o)
	}
	for _, o := range strategy.ClusterRoleBindings() {
		add(rbac("ClusterRoleBinding"), o)
	}
	for _, o := range strategy.Roles() {
		add(rbac("Role"), o)
	}
	for _, o := range strategy.RoleBindings() {
		add(rbac("RoleBinding"), o)
	}
	admission := func(kind string) schema.GroupVersionKind {
		return admissionregistrationv1.SchemeGroupVersion.WithKind(kind)
	}
	for _, o := range strategy.ValidatingAdmissionPolicies() {
		add(admission("ValidatingAdmissionPolicy"), o)
	}
	for _, o := range strategy.ValidatingAdmissionPolicyBindings() {
		add(admission("ValidatingAdmissionPolicyBinding"), o)
	}
	for _, o := range strategy.MutatingWebhookConfigurations() {
		// virt-operator installs the virt-launcher pod mutator (v1.8 on) only with the
		// ContainerPathVolumes feature gate, which the test cluster does not enable.
		if o.Name == "virt-launcher-pod-mutator" {
			continue
		}
		for i := range o.Webhooks {
			if err := toURL(&o.Webhooks[i].ClientConfig, *webhookURL, ca); err != nil {
				return fmt.Errorf("install: MutatingWebhookConfiguration %s: %w", o.Name, err)
			}
		}
		add(admission("MutatingWebhookConfiguration"), o)
	}
	for _, o := range strategy.ValidatingWebhookConfigurations() {
		// virt-operator's own validator: no virt-operator runs in the test cluster.
		if o.Namespace == "" && o.Webhooks != nil && o.Webhooks[0].ClientConfig.Service != nil &&
			o.Webhooks[0].ClientConfig.Service.Name != components.VirtApiServiceName {
			continue
		}
		for i := range o.Webhooks {
			if err := toURL(&o.Webhooks[i].ClientConfig, *webhookURL, ca); err != nil {
				return fmt.Errorf("install: ValidatingWebhookConfiguration %s: %w", o.Name, err)
			}
		}
		add(admission("ValidatingWebhookConfiguration"), o)
	}
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("install: marshal: %w", err)
		}
		if _, err := fmt.Fprintf(out, "---\n%s", b); err != nil {
			return err
		}
	}
	return nil
}

// toURL points a webhook that virt-operator points at the virt-api Service at base instead.
func toURL(cc *admissionregistrationv1.WebhookClientConfig, base string, ca []byte) error {
	if cc.Service == nil || cc.Service.Path == nil {
		return errors.New("webhook has no service path")
	}
	url := base + *cc.Service.Path
	cc.Service, cc.URL, cc.CABundle = nil, &url, ca
	return nil
}
