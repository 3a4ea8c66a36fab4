//go:build virtrules_oracle

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	k8sfield "k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/cache"

	v1 "kubevirt.io/api/core/v1"

	instancetypecontroller "kubevirt.io/kubevirt/pkg/instancetype/controller/vm"
	netadmitter "kubevirt.io/kubevirt/pkg/network/admitter"
	netvmispec "kubevirt.io/kubevirt/pkg/network/vmispec"
	"kubevirt.io/kubevirt/pkg/storage/cbt"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/mutating-webhook/mutators"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook/admitters"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	vmcontroller "kubevirt.io/kubevirt/pkg/virt-controller/watch/vm"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

// The users objects are created as: someone outside KubeVirt, or virt-controller (for the VMI
// of a VM).
const userName = "virt-rules-oracle"

func (c *cluster) controllerUser() string {
	return fmt.Sprintf("system:serviceaccount:%s:%s", c.kv.Namespace, components.ControllerServiceAccountName)
}

// object is a VM or VMI on its way through kube-apiserver's create: its JSON as the next step
// sees it.
type object struct {
	kind      string // VirtualMachine or VirtualMachineInstance
	namespace string
	name      string
	raw       []byte
}

// newObject takes an input document as kube-apiserver decodes a create of it: the namespace
// of the request (default, as kubectl's), and the kubevirt.io/v1 version KubeVirt stores.
func newObject(d document) (*object, []string, error) {
	o := d.obj.DeepCopy()
	var notes []string
	if o.GetNamespace() == "" {
		o.SetNamespace("default")
	}
	if gv := o.GetAPIVersion(); gv != v1.GroupVersion.String() {
		notes = append(notes, fmt.Sprintf("read as %s: kube-apiserver serves %s with the same schema", v1.GroupVersion, gv))
		o.SetAPIVersion(v1.GroupVersion.String())
	}
	raw, err := o.MarshalJSON()
	if err != nil {
		return nil, notes, fmt.Errorf("encode %s: %w", d.source, err)
	}
	return &object{kind: o.GetKind(), namespace: o.GetNamespace(), name: o.GetName(), raw: raw}, notes, nil
}

// persist does what kube-apiserver's registry does to a created object between the mutating
// and validating webhooks: a name for a generateName, a uid (here derived from kind, namespace
// and name, so that outputs compare across runs), the creation time and generation 1.
func (o *object) persist() error {
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(o.raw); err != nil {
		return fmt.Errorf("persist %s: %w", o.kind, err)
	}
	if u.GetName() == "" && u.GetGenerateName() != "" {
		// As kube-apiserver's name generator: five random characters.
		u.SetName(u.GetGenerateName() + utilrand.String(5))
	}
	if u.GetName() == "" {
		return fmt.Errorf("kube-apiserver refuses the %s: metadata.name or metadata.generateName is required", o.kind)
	}
	u.SetUID(types.UID(uuid.NewSHA1(uuid.NameSpaceURL, []byte("virt-rules-oracle:"+o.kind+"/"+u.GetNamespace()+"/"+u.GetName())).String()))
	u.SetCreationTimestamp(metav1.Now())
	u.SetGeneration(1)
	raw, err := u.MarshalJSON()
	if err != nil {
		return fmt.Errorf("persist %s: %w", o.kind, err)
	}
	o.name, o.raw = u.GetName(), raw
	return nil
}

// review is the AdmissionReview kube-apiserver sends virt-api for a create of o by user.
func (o *object) review(user string) *admissionv1.AdmissionReview {
	gvr := webhooks.VirtualMachineInstanceGroupVersionResource
	gvk := v1.VirtualMachineInstanceGroupVersionKind
	if o.kind == v1.VirtualMachineGroupVersionKind.Kind {
		gvr = webhooks.VirtualMachineGroupVersionResource
		gvk = v1.VirtualMachineGroupVersionKind
	}
	kind := metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind}
	dryRun := false
	return &admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:             types.UID(uuid.NewString()),
			Kind:            kind,
			Resource:        gvr,
			RequestKind:     &kind,
			RequestResource: &gvr,
			Name:            o.name,
			Namespace:       o.namespace,
			Operation:       admissionv1.Create,
			UserInfo:        authenticationv1.UserInfo{Username: user, Groups: []string{"system:authenticated"}},
			Object:          runtime.RawExtension{Raw: o.raw},
			DryRun:          &dryRun,
			Options:         runtime.RawExtension{Raw: []byte(`{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}`)},
		},
	}
}

// refusal is a webhook's answer that is not "allowed".
type refusal struct {
	webhook string
	resp    *admissionv1.AdmissionResponse
}

func (r *refusal) Error() string {
	msg := ""
	if r.resp.Result != nil {
		msg = r.resp.Result.Message
	}
	return fmt.Sprintf("%s refused it: %s", r.webhook, msg)
}

// mutate runs the mutating webhook of o's kind on its create by user and applies its patch, as
// kube-apiserver does. It returns the webhook's warnings.
func (c *cluster) mutate(o *object, user string) ([]string, error) {
	var resp *admissionv1.AdmissionResponse
	var webhook string
	err := safely("mutating webhook", func() error {
		ar := o.review(user)
		if o.kind == v1.VirtualMachineGroupVersionKind.Kind {
			webhook = "virt-api's VirtualMachine mutating webhook"
			resp = mutators.NewVMsMutator(c.config, c.client).Mutate(ar)
		} else {
			webhook = "virt-api's VirtualMachineInstance mutating webhook"
			resp = (&mutators.VMIsMutator{
				ClusterConfig:           c.config,
				VMIPresetInformer:       c.informers.VMIPresetInformer,
				KubeVirtServiceAccounts: c.serviceAccounts,
			}).Mutate(ar)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return nil, fmt.Errorf("%s gave no answer", webhook)
	}
	if !resp.Allowed {
		return resp.Warnings, &refusal{webhook: webhook, resp: resp}
	}
	if len(resp.Patch) == 0 {
		return resp.Warnings, nil
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		return resp.Warnings, fmt.Errorf("%s answered a patch of unknown type", webhook)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		return resp.Warnings, fmt.Errorf("%s: decode its patch: %w", webhook, err)
	}
	patched, err := patch.Apply(o.raw)
	if err != nil {
		return resp.Warnings, fmt.Errorf("%s: apply its patch: %w", webhook, err)
	}
	o.raw = patched
	return resp.Warnings, nil
}

// validate runs the validating webhook of o's kind on its create by user, as virt-api serves
// it.
func (c *cluster) validate(o *object, user string) (*admissionv1.AdmissionResponse, error) {
	var resp *admissionv1.AdmissionResponse
	err := safely("validating webhook", func() error {
		ar := o.review(user)
		if o.kind == v1.VirtualMachineGroupVersionKind.Kind {
			resp = admitters.NewVMsAdmitter(c.config, c.client, c.informers, c.serviceAccounts).Admit(context.Background(), ar)
		} else {
			resp = (&admitters.VMICreateAdmitter{
				ClusterConfig:           c.config,
				KubeVirtServiceAccounts: c.serviceAccounts,
				// virt-api registers the network spec validator with its VMI create webhook.
				SpecValidators: []admitters.SpecValidator{
					func(field *k8sfield.Path, spec *v1.VirtualMachineInstanceSpec, config *virtconfig.ClusterConfig) []metav1.StatusCause {
						return netadmitter.Validate(field, spec, config)
					},
				},
			}).Admit(context.Background(), ar)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return nil, errors.New("the validating webhook gave no answer")
	}
	return resp, nil
}

// validateOrRefuse is validate for the steps of a start: a refusal is an error.
func (c *cluster) validateOrRefuse(o *object, user string) ([]string, error) {
	resp, err := c.validate(o, user)
	if err != nil {
		return nil, err
	}
	if !resp.Allowed {
		hook := "virt-api's VirtualMachineInstance validating webhook"
		if o.kind == v1.VirtualMachineGroupVersionKind.Kind {
			hook = "virt-api's VirtualMachine validating webhook"
		}
		return resp.Warnings, &refusal{webhook: hook, resp: resp}
	}
	return resp.Warnings, nil
}

// startVM builds the VMI virt-controller's VM controller creates to start vm: KubeVirt's
// SetupVMIFromVM, then the steps its startVMI takes before creating the VMI.
func (c *cluster) startVM(vmRaw []byte) (*object, []string, error) {
	vm := &v1.VirtualMachine{}
	if err := json.Unmarshal(vmRaw, vm); err != nil {
		return nil, nil, fmt.Errorf("start: decode the VirtualMachine: %w", err)
	}
	if vm.Spec.Template == nil {
		return nil, nil, errors.New("start: the VirtualMachine has no template")
	}
	var notes []string
	var vmi *v1.VirtualMachineInstance
	err := safely("virt-controller's start of the VM", func() error {
		vmi = vmcontroller.SetupVMIFromVM(vm)
		// startVMI: the generation annotation, the migration-target annotation of a receiver,
		// virt-controller's finalizer.
		if vmi.Annotations == nil {
			vmi.Annotations = map[string]string{}
		}
		vmi.Annotations[v1.VirtualMachineGenerationAnnotation] = strconv.FormatInt(vm.Generation, 10)
		if vm.Spec.RunStrategy != nil && *vm.Spec.RunStrategy == v1.RunStrategyWaitAsReceiver {
			vmi.Annotations[v1.CreateMigrationTarget] = "true"
		}
		vmi.Finalizers = append(vmi.Finalizers, v1.VirtualMachineControllerFinalizer)

		it := c.instancetypeController()
		if err := it.ApplyAutoAttachPreferences(vm, vmi); err != nil {
			return fmt.Errorf("apply the preference's auto-attach devices: %w", err)
		}
		cbt.SetChangedBlockTrackingOnVMI(vm, vmi, c.config, c.namespaceStore)
		vmcontroller.AutoAttachInputDevice(vmi)
		if err := netvmispec.SetDefaultNetworkInterface(c.config, &vmi.Spec); err != nil {
			return fmt.Errorf("default network interface: %w", err)
		}
		if err := it.ApplyToVMI(vm, vmi); err != nil {
			return fmt.Errorf("apply the instancetype: %w", err)
		}
		var errs []error
		for _, cause := range netadmitter.NewValidator(k8sfield.NewPath("spec"), &vmi.Spec, c.config).ValidateCreation() {
			errs = append(errs, errors.New(cause.String()))
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("virt-controller's network validation: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, notes, fmt.Errorf("start: %w", err)
	}
	notes = append(notes, "virt-controller's VM revision (a ControllerRevision, status.virtualMachineRevisionName) is not created offline")
	if rs := vm.Spec.RunStrategy; rs != nil && (*rs == v1.RunStrategyHalted || *rs == v1.RunStrategyManual) {
		notes = append(notes, fmt.Sprintf("runStrategy %s: started as on a start request (virtctl start)", *rs))
	}
	if len(vm.Spec.DataVolumeTemplates) > 0 {
		notes = append(notes, "dataVolumeTemplates: virt-controller creates the DataVolumes and starts the VM once CDI has them ready; offline, started at once")
	}
	vmi.TypeMeta = metav1.TypeMeta{APIVersion: v1.GroupVersion.String(), Kind: v1.VirtualMachineInstanceGroupVersionKind.Kind}
	raw, err := json.Marshal(vmi)
	if err != nil {
		return nil, notes, fmt.Errorf("start: encode the VirtualMachineInstance: %w", err)
	}
	return &object{kind: vmi.Kind, namespace: vmi.Namespace, name: vmi.Name, raw: raw}, notes, nil
}

// instancetypeController is virt-controller's instancetype handler over empty stores: it
// falls back to the offline cluster's clients, which hold the instancetypes, preferences and
// ControllerRevisions given (a lookup is noted).
func (c *cluster) instancetypeController() interface {
	ApplyAutoAttachPreferences(*v1.VirtualMachine, *v1.VirtualMachineInstance) error
	ApplyToVMI(*v1.VirtualMachine, *v1.VirtualMachineInstance) error
} {
	empty := func() cache.Store { return cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc) }
	return instancetypecontroller.New(empty(), empty(), empty(), empty(), empty(), c.client, c.config, eventRecorder())
}
