//go:build virtrules_oracle

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	v1 "kubevirt.io/api/core/v1"

	ephemeraldisk "kubevirt.io/kubevirt/pkg/ephemeral-disk"
	cmdv1 "kubevirt.io/kubevirt/pkg/handler-launcher-com/cmd/v1"
	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/network/domainspec"
	"kubevirt.io/kubevirt/pkg/os/disk"
	kutil "kubevirt.io/kubevirt/pkg/util"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/efi"
)

// What virt-launcher's pod has, by its flags' defaults and its image's content.
const (
	// --ephemeral-disk-dir, and the folder of it virt-launcher gives its ephemeral disk creator.
	launcherEphemeralDiskDir = "/var/run/kubevirt-ephemeral-disks/disk-data"
	// --hypervisor (v1.KvmHypervisorName from KubeVirt v1.8 on).
	launcherHypervisor = "kvm"
	// The format virt-launcher reads from a containerDisk's image (qemu-img info); the
	// containerDisk images of KubeVirt's examples are qcow2.
	containerDiskFormat = "qcow2"
)

// launcherOVMFPath is virt-launcher's --ovmf-path on a node of each architecture:
// virt-controller passes the cluster config's OVMF path for the VMI's architecture, by default
// virt-config's DefaultARCHOVMFPath for amd64 and DefaultAARCH64OVMFPath for arm64, where
// virt-launcher's image of that architecture has its EFI firmware.
var launcherOVMFPath = map[string]string{
	"amd64": "/usr/share/OVMF",
	"arm64": "/usr/share/AAVMF",
}

// launcherOVMFFiles are the EFI firmware files of virt-launcher's image of each architecture in
// its launcherOVMFPath. amd64: CentOS Stream's edk2-ovmf puts only the secure-boot capable code
// there (virt-launcher boots EFI without secure boot on it too), and KubeVirt's image build
// adds the links for SEV, SEV-SNP and TDX (rpm/BUILD.bazel). arm64: CentOS Stream's
// edk2-aarch64 links AAVMF_CODE.fd and AAVMF_VARS.fd there, the only two files
// efi.DetectEFIEnvironment looks for on arm64 (it knows no secure boot or confidential
// firmware there).
var launcherOVMFFiles = map[string][]string{
	"amd64": {
		efi.EFICodeSecureBoot, efi.EFIVarsSecureBoot, efi.EFIVars,
		efi.EFICodeSEV, efi.EFICodeSNP, efi.EFICodeTDX, efi.EFICodeTDXSecureBoot,
	},
	"arm64": {efi.EFICodeAARCH64, efi.EFIVarsAARCH64},
}

// node is what virt-launcher finds in its pod on the test cluster's nodes of arch.
type node struct {
	arch      string // virt-launcher's runtime.GOARCH
	emulation bool   // no /dev/kvm
	efi       *efi.EFIEnvironment
	efiDir    string // the folder efi's paths are in, to be read as launcherOVMFPath[arch]
}

func newNode(emulation bool, arch string) (*node, error) {
	// virt-launcher's EFI environment is what efi.DetectEFIEnvironment finds in its image: let
	// it find the same files in a scratch folder, whose paths then read as the image's.
	dir, err := os.MkdirTemp("", "kubevirt-oracle-ovmf-")
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	defer os.RemoveAll(dir)
	for _, f := range launcherOVMFFiles[arch] {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	// virt-launcher detects its EFI environment for its own runtime.GOARCH
	// (NewLibvirtDomainManager).
	return &node{arch: arch, emulation: emulation, efi: efi.DetectEFIEnvironment(arch, dir), efiDir: dir}, nil
}

func (n *node) launcherPath(p string) string {
	if p == "" {
		return ""
	}
	return launcherOVMFPath[n.arch] + strings.TrimPrefix(p, n.efiDir)
}

// domainXML runs virt-launcher's converter on the VMI and marshals the domain as virt-launcher
// hands it to libvirt.
func (c *cluster) domainXML(vmiRaw []byte, n *node) (string, []string, error) {
	vmi := &v1.VirtualMachineInstance{}
	if err := json.Unmarshal(vmiRaw, vmi); err != nil {
		return "", nil, fmt.Errorf("converter: decode the VirtualMachineInstance: %w", err)
	}
	var xml string
	var notes []string
	err := safely("virt-launcher's converter", func() error {
		ctx, ctxNotes, err := c.converterContext(vmi, n)
		notes = ctxNotes
		if err != nil {
			return err
		}
		domain := &api.Domain{}
		// Convert_v1_VirtualMachineInstance_To_api_Domain takes a *ConverterContext whose
		// package moved in KubeVirt v1.8 (converter/types): the call goes through reflection so
		// that this source builds against both.
		res := reflect.ValueOf(converter.Convert_v1_VirtualMachineInstance_To_api_Domain).
			Call([]reflect.Value{reflect.ValueOf(vmi), reflect.ValueOf(domain), ctx})
		if e, _ := res[0].Interface().(error); e != nil {
			return fmt.Errorf("converter: %w", e)
		}
		// virt-launcher's SyncVMI: the defaults that do not come from the cluster.
		arch := ctx.Elem().FieldByName("Architecture").Interface().(arch.Converter).GetArchitecture()
		api.NewDefaulter(arch).SetObjectDefaults_Domain(domain)
		// The XML libvirt gets: what the hook manager marshals, with no hook sidecar.
		xml, err = hooks.GetManager().OnDefineDomain(&domain.Spec, vmi)
		if err != nil {
			return fmt.Errorf("marshal the domain: %w", err)
		}
		return nil
	})
	notes = append(notes,
		"domain as virt-launcher defines it before its pre-start hook: no pod network phase 2 (MAC addresses, tap devices), disk cache and IO modes, cloud-init/config disks' files or hotplug root ports, which need the pod and libvirt; metadata/kubevirt/uid is filled by virt-launcher's metadata cache later")
	return xml, notes, err
}

// converterContext is the ConverterContext virt-launcher builds (generateConverterContext)
// from the VirtualMachineOptions virt-handler sends it, on a node of n.arch with no SR-IOV, GPU
// or host devices. Its fields are set by name: those a KubeVirt version does not have are
// skipped.
func (c *cluster) converterContext(vmi *v1.VirtualMachineInstance, n *node) (reflect.Value, []string, error) {
	var notes []string
	ctxType := reflect.TypeOf(converter.Convert_v1_VirtualMachineInstance_To_api_Domain).In(2)
	ctx := reflect.New(ctxType.Elem())
	set := func(field string, value any) bool {
		f := ctx.Elem().FieldByName(field)
		if !f.IsValid() {
			return false
		}
		v := reflect.ValueOf(value)
		if !v.Type().AssignableTo(f.Type()) {
			panic(fmt.Sprintf("ConverterContext.%s is a %s, not a %s", field, f.Type(), v.Type()))
		}
		f.Set(v)
		return true
	}
	cfg := c.config

	// virt-launcher's converter is the one of its own runtime.GOARCH, whatever the VMI's
	// spec.architecture (which virt-controller's node selector makes the node's).
	set("Architecture", arch.NewConverter(n.arch))
	set("VirtualMachine", vmi)
	set("AllowEmulation", true)
	if !set("HypervisorDeviceAvailable", !n.emulation) {
		notes = append(notes, "this KubeVirt's converter looks for /dev/kvm on the host the oracle runs on")
	}
	set("HypervisorName", launcherHypervisor)

	// Volumes: none hotplugged, none a block device (virt-launcher looks at its pod's files).
	hotplug := map[string]v1.VolumeStatus{}
	permanent := map[string]v1.VolumeStatus{}
	for _, s := range vmi.Status.VolumeStatus {
		if s.HotplugVolume != nil {
			hotplug[s.Name] = s
		} else {
			permanent[s.Name] = s
		}
	}
	isBlockPVC, isBlockDV := map[string]bool{}, map[string]bool{}
	disksInfo := map[string]*disk.DiskInfo{}
	for _, vol := range vmi.Spec.Volumes {
		switch {
		case vol.PersistentVolumeClaim != nil || vol.Ephemeral != nil:
			isBlockPVC[vol.Name] = false
			notes = append(notes, fmt.Sprintf("volume %s: taken as a filesystem PVC (virt-launcher tells a block one from its pod)", vol.Name))
		case vol.DataVolume != nil:
			isBlockDV[vol.Name] = false
			notes = append(notes, fmt.Sprintf("volume %s: taken as a filesystem DataVolume (virt-launcher tells a block one from its pod)", vol.Name))
		}
		if vol.ContainerDisk != nil {
			disksInfo[vol.Name] = &disk.DiskInfo{Format: containerDiskFormat}
			notes = append(notes, fmt.Sprintf("volume %s: containerDisk image taken as %s (virt-launcher reads its format from the image)", vol.Name, containerDiskFormat))
		}
	}
	set("HotplugVolumes", hotplug)
	set("PermanentVolumes", permanent)
	set("IsBlockPVC", isBlockPVC)
	set("IsBlockDV", isBlockDV)
	set("DisksInfo", disksInfo)
	set("EphemeraldiskCreator", ephemeraldisk.EphemeralDiskCreatorInterface(ephemeraldisk.NewEphemeralDiskCreator(launcherEphemeralDiskDir)))

	if vmi.IsBootloaderEFI() {
		efiConf, err := n.efiConfiguration(vmi, ctxType.Elem())
		if err != nil {
			return ctx, notes, err
		}
		ctx.Elem().FieldByName("EFIConfiguration").Set(efiConf)
	}

	set("UseVirtioTransitional", vmi.Spec.Domain.Devices.UseVirtioTransitional != nil && *vmi.Spec.Domain.Devices.UseVirtioTransitional)
	set("UseLaunchSecuritySEV", kutil.IsSEVVMI(vmi))
	set("UseLaunchSecurityTDX", kutil.IsTDXVMI(vmi))
	set("UseLaunchSecurityPV", kutil.IsSecureExecutionVMI(vmi))

	// virt-handler's VirtualMachineOptions, from the cluster config (virtualMachineOptions,
	// syncVirtualMachine), as virt-launcher copies them into the context.
	if smbios := cfg.GetSMBIOS(); smbios != nil {
		set("SMBios", &cmdv1.SMBios{
			Family: smbios.Family, Product: smbios.Product, Manufacturer: smbios.Manufacturer,
			Sku: smbios.Sku, Version: smbios.Version,
		})
	}
	set("Topology", &cmdv1.Topology{})
	set("MemBalloonStatsPeriod", uint(cfg.GetMemBalloonStatsPeriod()))
	set("ExpandDisksEnabled", cfg.ExpandDisksEnabled())
	set("FreePageReporting", freePageReporting(cfg.IsFreePageReportingDisabled(), vmi))
	set("BochsForEFIGuests", !cfg.VGADisplayForEFIGuestsEnabled())
	set("SerialConsoleLog", serialConsoleLog(cfg.IsSerialConsoleLogDisabled(), vmi))
	if m := reflect.ValueOf(cfg).MethodByName("PCINUMAAwareTopologyEnabled"); m.IsValid() {
		set("PCINUMAAwareTopologyEnabled", m.Call(nil)[0].Bool())
	}
	set("DomainAttachmentByInterfaceName", domainspec.DomainAttachmentByInterfaceName(vmi.Spec.Domain.Devices.Interfaces, cfg.GetNetworkBindings()))

	// No devices on the node: SR-IOV, GPU and host devices stay empty.
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.SRIOV != nil {
			notes = append(notes, fmt.Sprintf("interface %s: SR-IOV, no device on the node: no hostdev in the domain", iface.Name))
		}
	}
	if len(vmi.Spec.Domain.Devices.GPUs) > 0 {
		notes = append(notes, "GPUs: no device on the node: no hostdev in the domain")
	}
	if len(vmi.Spec.Domain.Devices.HostDevices) > 0 {
		notes = append(notes, "host devices: no device on the node: no hostdev in the domain")
	}
	if kutil.IsVFIOVMI(vmi) || len(vmi.Spec.ResourceClaims) > 0 {
		notes = append(notes, "devices the node would allocate (VFIO, DRA) are not in the domain")
	}
	if vmi.Spec.Domain.CPU != nil && vmi.Spec.Domain.CPU.DedicatedCPUPlacement {
		notes = append(notes, "dedicated CPUs: the pod's CPU set and the node's NUMA topology are empty offline")
	}
	if _, ok := vmi.Annotations["hooks.kubevirt.io/hookSidecars"]; ok {
		notes = append(notes, "hook sidecars are not run")
	}
	return ctx, notes, nil
}

// efiConfiguration is virt-launcher's choice of firmware files for an EFI VMI, as an
// EFIConfiguration of the context's package.
func (n *node) efiConfiguration(vmi *v1.VirtualMachineInstance, ctxType reflect.Type) (reflect.Value, error) {
	bootEFI := vmi.Spec.Domain.Firmware.Bootloader.EFI
	secureBoot := bootEFI.SecureBoot == nil || *bootEFI.SecureBoot
	vmType := efi.None
	switch {
	case kutil.IsSEVSNPVMI(vmi):
		vmType = efi.SNP
	case kutil.IsSEVVMI(vmi):
		vmType = efi.SEV
	case kutil.IsTDXVMI(vmi):
		vmType = efi.TDX
	}
	if !n.efi.Bootable(secureBoot, vmType) {
		return reflect.Value{}, fmt.Errorf("virt-launcher has no EFI firmware for secure boot %v and confidential type %d", secureBoot, vmType)
	}
	field, ok := ctxType.FieldByName("EFIConfiguration")
	if !ok {
		return reflect.Value{}, fmt.Errorf("this KubeVirt's ConverterContext has no EFIConfiguration")
	}
	conf := reflect.New(field.Type.Elem())
	conf.Elem().FieldByName("EFICode").SetString(n.launcherPath(n.efi.EFICode(secureBoot, vmType)))
	conf.Elem().FieldByName("EFIVars").SetString(n.launcherPath(n.efi.EFIVars(secureBoot, vmType)))
	conf.Elem().FieldByName("SecureLoader").SetBool(secureBoot)
	return conf, nil
}

// freePageReporting is virt-launcher's rule for the balloon's free page reporting: on, unless
// the cluster turns it off, the VMI has no balloon, is a high-performance VMI, or opts out by
// annotation.
func freePageReporting(clusterDisabled bool, vmi *v1.VirtualMachineInstance) bool {
	noBalloon := vmi.Spec.Domain.Devices.AutoattachMemBalloon != nil && !*vmi.Spec.Domain.Devices.AutoattachMemBalloon
	optOut := vmi.Annotations[v1.FreePageReportingDisabledAnnotation] == "true"
	return !clusterDisabled && !noBalloon && !vmi.IsHighPerformanceVMI() && !optOut
}

// serialConsoleLog is virt-launcher's rule for logging the serial console: the VMI's choice,
// or the cluster's when the VMI has none.
func serialConsoleLog(clusterDisabled bool, vmi *v1.VirtualMachineInstance) bool {
	if own := vmi.Spec.Domain.Devices.LogSerialConsole; own != nil {
		return *own
	}
	return !clusterDisabled
}
