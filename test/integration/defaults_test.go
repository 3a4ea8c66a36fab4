//go:build libvirt

package integration_test

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/virt-rules/virt-rules/controllers"
	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/manifest"
	"github.com/virt-rules/virt-rules/test/testcluster"
)

// startDefaultsManager runs the controllers as `virt-rules controller --webhook-cert-dir ...
// --defaulter-url url` does, serving the webhooks envtest installed.
func startDefaultsManager(webhooks *envtest.WebhookInstallOptions, url string) (stop func()) {
	GinkgoHelper()
	return startDefaultsManagerWith(webhooks, url, "", "")
}

// startDefaultsManagerWith also trusts caFile and sends the token in tokenFile to the defaulter
// (--defaulter-ca-file, --defaulter-token-file).
func startDefaultsManagerWith(webhooks *envtest.WebhookInstallOptions, url, caFile, tokenFile string) (stop func()) {
	GinkgoHelper()
	logger := slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctrl.SetLogger(logr.FromSlogHandler(logger.Handler()))
	eng, err := engine.New(ctx, engine.WithLogger(logger))
	Expect(err).NotTo(HaveOccurred())
	vr, err := testcluster.RunVirtRules(ctx, cfg, eng, testcluster.VirtRulesOptions{
		Controllers: controllers.Options{ConcurrentSyncs: 2, DefaulterURL: url, DefaulterTimeout: 4 * time.Second, DefaulterCAFile: caFile, DefaulterTokenFile: tokenFile},
		Webhooks:    webhooks,
	})
	Expect(err).NotTo(HaveOccurred())
	return func() { Expect(vr.Stop()).To(Succeed()) }
}

const defaultsVM = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: testvm}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        machine: {type: q35}
        devices:
          disks: [{name: root, disk: {bus: virtio}}]
          interfaces: [{name: default, masquerade: {}}]
        memory: {guest: 64Mi}
      networks: [{name: default, pod: {}}]
      volumes: [{name: root, dataVolume: {name: root-dv-that-does-not-exist}}]
`

func typedVM(u *unstructured.Unstructured) *kubevirtv1.VirtualMachine {
	GinkgoHelper()
	vm := &kubevirtv1.VirtualMachine{}
	raw, err := u.MarshalJSON()
	Expect(err).NotTo(HaveOccurred())
	Expect(json.Unmarshal(raw, vm)).To(Succeed())
	return vm
}

var _ = Describe("VM defaults webhook", Ordered, func() {
	var (
		webhooks *envtest.WebhookInstallOptions
		stop     func()
		lv       *defaults.Libvirt
		service  *httptest.Server
	)

	BeforeAll(func() {
		root, err := os.MkdirTemp("/dev/shm", "virt-rules-integration-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, root)
		lv, err = defaults.OpenLibvirt(ctx, root, nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(lv.Close)
		eng, err := engine.New(ctx)
		Expect(err).NotTo(HaveOccurred())
		svc := defaults.NewService(eng, nil)
		svc.SetHypervisor(lv)
		service = httptest.NewServer(svc)
		DeferCleanup(service.Close)

		webhooks = &envtest.WebhookInstallOptions{Paths: []string{filepath.Join(repoRoot, "examples", "deploy", "defaults", "mutating.yaml")}}
		Expect(webhooks.Install(cfg)).To(Succeed())
		stop = startDefaultsManager(webhooks, service.URL)
	})

	AfterAll(func() {
		if stop != nil {
			stop()
		}
		for _, c := range webhooks.MutatingWebhooks {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, c.DeepCopy()))).To(Succeed())
		}
		Expect(webhooks.Cleanup()).To(Succeed())
	})

	It("shows the defaulted VM on a server-side dry-run create, and stores nothing", func() {
		ns := createNamespace()
		vm := fromYAML(defaultsVM)
		vm.SetNamespace(ns)
		Expect(k8sClient.Create(ctx, vm, client.DryRunAll)).To(Succeed())
		d := typedVM(vm).Spec.Template.Spec.Domain
		Expect(d.Machine.Type).To(Equal("q35"))
		Expect(d.Devices.Interfaces[0].MacAddress).To(MatchRegexp(`^02(:[0-9a-f]{2}){5}$`))
		Expect(d.Devices.Interfaces[0].Model).To(Equal("virtio"), "KubeVirt's NIC model")
		Expect(d.Devices.Interfaces[0].PciAddress).To(MatchRegexp(`^0000:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`))
		Expect(d.Devices.Disks[0].Disk.Bus).To(BeEquivalentTo("virtio"))
		Expect(d.Devices.Disks[0].Disk.PciAddress).NotTo(BeEmpty())
		Expect(string(d.Firmware.UUID)).NotTo(BeEmpty())
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(vm), fromYAML(defaultsVM))
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a dry run stores nothing: %v", err)
	})

	It("stores a created VM fully defaulted, the same as the dry run showed", func() {
		ns := createNamespace()
		dry := fromYAML(defaultsVM)
		dry.SetNamespace(ns)
		Expect(k8sClient.Create(ctx, dry, client.DryRunAll)).To(Succeed())
		vm := fromYAML(defaultsVM)
		vm.SetNamespace(ns)
		create(vm)
		stored := fromYAML(defaultsVM)
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(vm), stored)).To(Succeed())
		Expect(typedVM(stored).Spec).To(Equal(typedVM(dry).Spec))
		Expect(typedVM(stored).Spec.Template.Spec.Domain.Devices.AutoattachMemBalloon).To(HaveValue(BeTrue()))
	})

	It("defaults a created VirtualMachineInstance, keeping what the user set", func() {
		ns := createNamespace()
		vmi := fromYAML(`
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vmi}
spec:
  domain:
    devices:
      interfaces: [{name: default, masquerade: {}, model: virtio, macAddress: "02:00:00:00:00:07"}]
    memory: {guest: 128Mi}
  networks: [{name: default, pod: {}}]
`)
		vmi.SetNamespace(ns)
		create(vmi)
		got := &kubevirtv1.VirtualMachineInstance{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(vmi), got)).To(Succeed())
		nic := got.Spec.Domain.Devices.Interfaces[0]
		Expect(nic.Model).To(Equal("virtio"))
		Expect(nic.MacAddress).To(Equal("02:00:00:00:00:07"))
		Expect(nic.PciAddress).To(Equal("0000:01:00.0"), "behind q35's first PCIe root port")
		Expect(got.Spec.Domain.Machine.Type).To(Equal("q35"), "KubeVirt's machine type, not libvirt's")
	})

	It("rejects an invalid VM with the field at fault", func() {
		ns := createNamespace()
		vm := fromYAML(defaultsVM)
		vm.SetNamespace(ns)
		unstructured.RemoveNestedField(vm.Object, "spec", "template", "spec", "domain", "memory")
		err := k8sClient.Create(ctx, vm)
		Expect(err).To(MatchError(ContainSubstring("spec.template.spec.domain.memory.guest")))
	})

	It("gives VMs created from one manifest with generateName their own MACs and UUIDs", func() {
		ns := createNamespace()
		var macs, uuids []string
		for range 2 {
			vm := fromYAML(defaultsVM)
			vm.SetNamespace(ns)
			vm.SetName("")
			vm.SetGenerateName("replica-")
			create(vm)
			d := typedVM(vm).Spec.Template.Spec.Domain
			macs = append(macs, d.Devices.Interfaces[0].MacAddress)
			uuids = append(uuids, string(d.Firmware.UUID))
		}
		Expect(macs[0]).NotTo(Equal(macs[1]))
		Expect(uuids[0]).NotTo(Equal(uuids[1]))
	})

	It("follows its failurePolicy when the defaulter is unavailable: Ignore (shipped) admits undefaulted, Fail rejects", func() {
		stop()
		eng, err := engine.New(ctx)
		Expect(err).NotTo(HaveOccurred())
		cold := httptest.NewServer(defaults.NewService(eng, nil)) // never gets libvirt: 503
		DeferCleanup(cold.Close)
		stop = startDefaultsManager(webhooks, cold.URL)

		cfgs := &admissionregistrationv1.MutatingWebhookConfiguration{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "zz-virt-rules-defaults"}, cfgs)).To(Succeed())
		Expect(cfgs.Webhooks[0].FailurePolicy).To(HaveValue(Equal(admissionregistrationv1.Ignore)), "no VM create fails because virt-rules is down")
		Expect(cfgs.Webhooks[0].TimeoutSeconds).To(HaveValue(BeEquivalentTo(5)))
		Expect(cfgs.Webhooks[0].ReinvocationPolicy).To(HaveValue(Equal(admissionregistrationv1.IfNeededReinvocationPolicy)))
		Expect(cfgs.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values).To(ContainElements("kube-system", "kubevirt", "virt-rules"))

		ns := createNamespace()
		vm := fromYAML(defaultsVM)
		vm.SetNamespace(ns)
		Expect(k8sClient.Create(ctx, vm.DeepCopy())).To(Succeed())
		stored := fromYAML(defaultsVM)
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(vm), stored)).To(Succeed())
		Expect(typedVM(stored).Spec.Template.Spec.Domain.Firmware).To(BeNil(), "admitted as sent")

		fail := admissionregistrationv1.Fail
		cfgs.Webhooks[0].FailurePolicy = &fail
		Expect(k8sClient.Update(ctx, cfgs)).To(Succeed())
		other := vm.DeepCopy()
		other.SetName("refused")
		Eventually(func() error { return k8sClient.Create(ctx, other.DeepCopy()) }).Should(MatchError(ContainSubstring("defaults.vm.mutate.virt-rules.io")))
		ignore := admissionregistrationv1.Ignore
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "zz-virt-rules-defaults"}, cfgs)).To(Succeed())
		cfgs.Webhooks[0].FailurePolicy = &ignore
		Expect(k8sClient.Update(ctx, cfgs)).To(Succeed())
	})

	It("ships manifests the API server accepts", func() {
		objs, err := manifest.Read([]string{
			filepath.Join(repoRoot, "examples", "deploy", "base", "namespace.yaml"),
			filepath.Join(repoRoot, "examples", "deploy", "defaults", "defaulter.yaml"),
			filepath.Join(repoRoot, "examples", "deploy", "defaults", "mutating.yaml"),
		}, nil)
		Expect(err).NotTo(HaveOccurred())
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, o.Unstructured.DeepCopy()))).To(Succeed())
				continue
			}
			obj := o.Unstructured.DeepCopy()
			obj.SetName(obj.GetName() + "-dry-run") // the webhook configuration is installed already
			Expect(k8sClient.Create(ctx, obj, client.DryRunAll)).To(Succeed(), o.Describe())
		}
	})
})
