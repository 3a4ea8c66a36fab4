//go:build virtrules_oracle

// Command kubevirt-oracle answers from KubeVirt's own code, so that virt-rules' tests have an
// oracle no one in this project wrote. It is built by hack/kubevirt.sh inside a copy of the
// kubevirt.io/kubevirt module at the version the test cluster runs (the build tag keeps it out
// of virt-rules' own module), never committed as a binary.
//
//	kubevirt-oracle version
//	kubevirt-oracle install --webhook-url https://127.0.0.1:PORT --ca-file CA.crt [--namespace kubevirt]
//	kubevirt-oracle convert [--kubevirt KV.yaml] [--arch amd64|arm64] [--emulation] FILE...
//	kubevirt-oracle admit [--kubevirt KV.yaml] [--arch amd64|arm64] [--mutate] FILE...
//	kubevirt-oracle migration-policy [--kubevirt KV.yaml] [--arch amd64|arm64] FILE...
//	kubevirt-oracle node-labels [--kubevirt KV.yaml] DIR...
//
// install prints, as one YAML stream, what virt-operator's install strategy would create for
// virt-api and virt-controller to run: every CustomResourceDefinition (and the KubeVirt CRD
// virt-operator's own manifest brings), the ServiceAccounts,
// RBAC and ValidatingAdmissionPolicies, and virt-api's mutating and validating webhook
// configurations with each webhook's Service replaced by the URL virt-api listens on (the test
// cluster's kube-apiserver has no cluster network) and the given CA bundle.
//
// convert and admit read YAML or JSON streams (several documents a file, "-" for stdin; a
// List's items count as documents) of kubevirt.io/v1 VirtualMachines and
// VirtualMachineInstances, and print one JSON object a line for each document, in input order.
// Documents of other kinds get a line with "skipped": true; instancetypes, preferences
// (instancetype.kubevirt.io/v1beta1) and ControllerRevisions among them are in the offline
// cluster, where KubeVirt's code finds what VMs refer to. The cluster configuration is the
// KubeVirt CR of --kubevirt (its first KubeVirt document), by default one named kubevirt in
// namespace kubevirt with an empty spec and status.defaultArchitecture amd64; it goes through
// virt-config's ClusterConfig as in virt-api, for an amd64 control plane. --arch arm64 (of
// convert, admit and migration-policy) makes nodes and control plane arm64 instead: the
// ClusterConfig's CPU architecture, the default CR's status.defaultArchitecture (and that of a
// --kubevirt CR without one), virt-launcher's EFI firmware and converter. As virt-operator
// does, a CR's spec.configuration.architectureConfiguration.defaultArchitecture replaces its
// status'. Clients KubeVirt's code asks for are fakes of an empty cluster: each lookup made is
// listed in "notes".
//
// convert does what KubeVirt does to start each object, with KubeVirt's code at each step:
// for a VirtualMachine, virt-api's VM mutating webhook and VM validating webhook on CREATE,
// then virt-controller's start of it (SetupVMIFromVM and the steps its VM controller takes
// before creating the VMI); for both kinds, virt-api's VMI mutating and validating webhooks on
// CREATE (the VMI of a VM as virt-controller's service account creates it), then
// virt-launcher's converter with the ConverterContext virt-handler and virt-launcher would
// give it on an amd64 (--arch) KVM node with no SR-IOV, GPU or host devices, and the domain
// XML as virt-launcher marshals it for libvirt (before libvirt's own defaults, and before
// virt-launcher's pre-start hook, which needs the pod: see the notes of each line). The patches
// the mutating webhooks answer are applied with the JSON-patch library kube-apiserver uses.
//
//	{"source":"FILE#N","kind":"VirtualMachine","namespace":"default","name":"vm",
//	 "vm":{...},"vmi":{...},"domain":"<domain ...>","notes":[...],"error":"..."}
//
// "vm" is the VirtualMachine as stored after its mutating webhook (VirtualMachines only), "vmi"
// the VirtualMachineInstance as stored after its mutating webhook, "domain" the XML; "error"
// says why an object stopped short (a webhook refused it, the converter failed...), and the
// command goes on with the next one. --emulation models a node without /dev/kvm (domain type
// qemu). The source builds against KubeVirt v1.7 too: the ConverterContext, whose package moved
// in v1.8, is filled field by field through reflection; v1.7's has no hypervisor fields, and
// its converter looks for /dev/kvm on the machine the oracle runs on (--emulation does nothing).
//
// admit runs virt-api's validating webhook for the object's kind on CREATE, as virt-api does
// (the VM admitter, or the VMI create admitter with virt-api's network spec validator), as a
// user that is not one of KubeVirt's service accounts; with --mutate, the object first goes
// through the mutating webhook of its kind, whose refusal is then the answer. Without it, a VMI
// is refused for its empty spec.architecture, which the mutating webhook sets: kube-apiserver
// never sends virt-api's validating webhook an object its mutating one has not seen.
//
//	{"source":"FILE#N","kind":"VirtualMachine","namespace":"default","name":"vm",
//	 "allowed":false,"message":"...","causes":[{"type":"FieldValueInvalid","field":"spec...",
//	 "message":"..."}],"warnings":[...],"notes":[...],"error":"..."}
//
// "allowed" is absent for a skipped document; "error" says why the oracle has no answer of
// KubeVirt's (then "allowed" is false).
//
// migration-policy reads MigrationPolicies (migrations.kubevirt.io/v1alpha1),
// VirtualMachineInstances and Namespaces from the same kind of streams, as the objects of one
// cluster, and prints one line per document, in input order. A MigrationPolicy gets the
// verdict of virt-api's MigrationPolicy validating webhook on its create (KubeVirt's
// MigrationPolicyAdmitter; from v1.9 on it reads the --kubevirt CR's feature gates), in
// admit's shape; a second policy of a name already admitted is refused as kube-apiserver
// refuses it (already exists). A VirtualMachineInstance gets the MigrationPolicy
// virt-controller's migration controller applies to it when it migrates: KubeVirt's own
// matchPolicy (pkg/virt-controller/watch/migration, unexported; hack/kubevirt.sh copies a
// one-line exporting wrapper of virt-rules', hack/kubevirt/export/, into that package of the
// module copy it builds in), given every policy the admitter admitted and the VMI's
// Namespace:
//
//	{"source":"FILE#N","kind":"VirtualMachineInstance","namespace":"default","name":"vmi",
//	 "policy":"name or null","notes":[...],"error":"..."}
//
// Objects are read as virt-controller's informers get them from kube-apiserver, through the
// JSON of KubeVirt's types: an empty metadata.labels map is no labels at all (nil), which
// matchPolicy tells apart from labels. Every Namespace carries kubernetes.io/metadata.name set
// to its name, as kube-apiserver makes it; a VMI whose Namespace is not among the inputs is in
// one with only that label (said in its notes). Namespaces and other kinds get a line with
// "skipped": true.
//
// node-labels prints, for each DIR in order, the labels virt-handler's node labeller gives an
// amd64 Node whose DIR holds what virt-launcher's node-labeller.sh writes there:
// virsh_domcapabilities.xml (`virsh domcapabilities`) and supported_features.xml (`virsh
// hypervisor-cpu-baseline --features` of it). They are KubeVirt's own loadAll and
// prepareLabels (pkg/virt-handler/node-labeller, unexported; through an exporting function of
// virt-rules' in hack/kubevirt/export/, whose doc comment has the details), with the --kubevirt
// CR's obsoleteCPUModels filtering the cpu-model and cpu-model-migration labels:
//
//	{"source":"DIR","labels":{"cpu-model.node.kubevirt.io/Penryn":"true",...},"error":"..."}
//
// The labels depend on the files and the CR alone. There is never a hyperv.node.kubevirt.io/
// label (KubeVirt asks /dev/kvm in cgo code, which the oracle is built without: no Hyper-V
// capability, as when /dev/kvm cannot be opened), a cpu-timer.node.kubevirt.io/ one (from the
// TSC counter of `virsh capabilities`) or a machine-type.node.kubevirt.io/ one (from its guest
// machines); kubevirt.io/realtime, which KubeVirt sets from a sysctl of the machine it runs on,
// is dropped. The node labeller's unexported API it calls is the same in KubeVirt v1.7.
// "labels" is null when "error" says why KubeVirt could not read DIR's files (a file missing
// or not XML), and the command goes on with the next DIR.
//
// Around the webhooks, each object gets what kube-apiserver does on a create: the namespace
// (default when it has none) before them; between the mutating and the validating ones, a name
// for a generateName, a uid derived from kind, namespace and name, a creation time and
// generation 1. The UUIDs KubeVirt's code draws for an object (firmware UUID and serial) are
// seeded from its kind, namespace and name too, so that the domain XML is the same from run to
// run; timestamps are not. KubeVirt's own log lines of warning or error level go into the
// notes. The exit status is non-zero only for usage and input/output errors (a file that
// cannot be read or parsed, an invalid --kubevirt).
//
// Linking virt-api's webhooks brings KubeVirt's OpenAPI validator, whose package init takes
// about 2.4 s on the test machines: every subcommand, version and install included, pays it.
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

const usage = "usage: kubevirt-oracle version | install --webhook-url URL --ca-file FILE [--namespace NS]" +
	" | convert [--kubevirt KV.yaml] [--arch ARCH] [--emulation] FILE..." +
	" | admit [--kubevirt KV.yaml] [--arch ARCH] [--mutate] FILE..." +
	" | migration-policy [--kubevirt KV.yaml] [--arch ARCH] FILE..." +
	" | node-labels [--kubevirt KV.yaml] DIR..."

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "version":
		_, err := fmt.Fprintln(out, kubevirtVersion)
		return err
	case "install":
		return installCmd(args[1:], out)
	case "convert":
		return convertCmd(args[1:], os.Stdin, out)
	case "admit":
		return admitCmd(args[1:], os.Stdin, out)
	case "migration-policy":
		return migrationPolicyCmd(args[1:], os.Stdin, out)
	case "node-labels":
		return nodeLabelsCmd(args[1:], out)
	default:
		return fmt.Errorf("unknown command %q; %s", args[0], usage)
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
