# VM defaults (0) - what KubeVirt decides first (package documentation in plan.rego).
#
# The domain libvirt is asked about is the one KubeVirt's virt-launcher would define for the
# same VM. Before its converter runs, virt-api's mutating webhook fills in the VMI's spec from
# the cluster's configuration (the KubeVirt CR's spec.configuration) and KubeVirt's API
# defaults. This file mirrors that step for every field that changes what the guest sees; the
# rest of plan.rego mirrors the converter (and virt-launcher's hotplug port reservation).
#
# Input read here (besides plan.rego's):
#   kubevirt: the KubeVirt CR's spec and status.defaultArchitecture (in a cluster, the webhook
#             sends the live CR; offline, the file given to --kubevirt), or null: KubeVirt's
#             built-in configuration
#
# amd64 and arm64 are mirrored (KubeVirt's pkg/defaults amd64.go and arm64.go, and the arm64
# checks of virt-api's validating webhook, webhooks/arm64.go); a VM of another architecture
# (s390x, ppc64le) is refused as unsupported rather than given a guest of another.
package virtrules.vm.defaults

_kubevirt := input.kubevirt if is_object(input.kubevirt)

else := {}

_configuration := object.get(_kubevirt, ["spec", "configuration"], {})

# The cluster's configuration as far as it changes a guest: each value as KubeVirt's cluster
# configuration reads it, its built-in default when the KubeVirt CR leaves it unset.
cluster := {
	"architecture": _default_architecture,
	"machine_types": {arch: _first_set([
		object.get(_configuration, "machineType", ""),
		object.get(_configuration, ["architectureConfiguration", arch, "machineType"], ""),
		facts.machine,
	]) |
		some arch, facts in architectures
	},
	"cpu_model": object.get(_configuration, "cpuModel", ""),
	"default_network_interface": object.get(_configuration, ["network", "defaultNetworkInterface"], "bridge"),
	"permit_bridge_on_pod_network": object.get(_configuration, ["network", "permitBridgeInterfaceOnPodNetwork"], true),
	"live_update": object.get(_configuration, "vmRolloutStrategy", "LiveUpdate") == "LiveUpdate",
	"max_cpu_sockets": object.get(_configuration, ["liveUpdateConfiguration", "maxCpuSockets"], 0),
	"max_hotplug_ratio": object.get(_configuration, ["liveUpdateConfiguration", "maxHotplugRatio"], 4),
	"free_page_reporting": object.get(_configuration, ["virtualMachineOptions", "disableFreePageReporting"], null) == null,
}

# virt-operator records the control plane's architecture in the CR's status; the configuration
# may override it.
_default_architecture := arch if {
	arch := _configuration.architectureConfiguration.defaultArchitecture
	arch != ""
} else := arch if {
	arch := _kubevirt.status.defaultArchitecture
	arch != ""
} else := "amd64"

# The architectures mirrored, each with KubeVirt's default machine type (virt-config's
# DefaultAMD64MachineType and DefaultAARCH64MachineType), libvirt's name of it, and the Debian
# packages whose QEMU runs its guests.
architectures := {
	"amd64": {"machine": "q35", "libvirt": "x86_64", "packages": "qemu-system-x86"},
	"arm64": {"machine": "virt", "libvirt": "aarch64", "packages": "qemu-system-arm and qemu-efi-aarch64"},
}

# The machine type of each: the deprecated top-level machineType wins over the
# per-architecture one, as in KubeVirt (ClusterConfig.GetMachineType), else KubeVirt's.
_first_set(values) := [v | some v in values; v != ""][0]

# The mutated spec's values -----------------------------------------------------------------------

architecture := arch if {
	arch := _spec.architecture
	is_string(arch)
	arch != ""
} else := cluster.architecture

_unsupported contains {"field": "architecture", "message": sprintf("architecture %q: these defaults mirror KubeVirt's amd64 and arm64 guests only", [architecture])} if {
	not architectures[architecture]
}

# The machine type: the VM's, else the cluster's for its architecture.
machine_type := mt if {
	mt := object.get(_spec, ["domain", "machine", "type"], "")
	mt != ""
} else := mt if {
	mt := cluster.machine_types[architecture]
} # an architecture not mirrored: refused as unsupported

else := ""

# The CPU model: the VM's, else (arm64) host-passthrough, the only one KubeVirt runs there and
# set before the cluster's is looked at; else the cluster's, else host-model.
cpu_model := m if {
	m := object.get(_spec, ["domain", "cpu", "model"], "")
	m != ""
} else := "host-passthrough" if {
	architecture == "arm64"
} else := cluster.cpu_model if {
	cluster.cpu_model != ""
} else := "host-model"

# KubeVirt's bus for a disk, cdrom or lun without one: on amd64 SATA, which every guest OS
# supports out of the box; on arm64 virtio, as QEMU's arm64 machines have no SATA.
default_disk_bus := "virtio" if architecture == "arm64"

else := "sata"

# arm64 boots UEFI without secure boot when the VM names no bootloader (KubeVirt's
# setDefaultArm64Bootloader); its guest is then EFI's.
default default_efi := false

default_efi if {
	architecture == "arm64"
	object.get(_spec, ["domain", "firmware", "bootloader"], null) == null
}

_arm64_refusals contains ["domain.firmware.bootloader.bios", "Arm64 does not support bios boot, please change to uefi boot"] if {
	is_object(object.get(_spec, ["domain", "firmware", "bootloader", "bios"], null))
}

_arm64_refusals contains ["domain.firmware.bootloader.efi.secureBoot", "UEFI secure boot is currently not supported on aarch64 Arch"] if {
	is_object(object.get(_spec, ["domain", "firmware", "bootloader", "efi"], null))
	object.get(_spec, ["domain", "firmware", "bootloader", "efi", "secureBoot"], true) != false
}

_arm64_refusals contains ["domain.cpu.model", "currently, host-passthrough is the only model supported on Arm64"] if {
	not cpu_model == "host-passthrough"
}

_arm64_refusals contains [sprintf("domain.devices.disks[%d].%s.bus", [i, kind]), "Arm64 not support this disk bus type, please use virtio or scsi"] if {
	some i, bus in _disk_buses
	not bus in {"virtio", "scsi"}
	kind := _kinds[i]
}

_arm64_refusals contains ["domain.devices.watchdog", "Arm64 not support Watchdog device"] if {
	is_object(object.get(_spec, ["domain", "devices", "watchdog"], null))
}

_arm64_refusals contains ["domain.devices.sound", "Arm64 not support sound device"] if {
	is_object(object.get(_spec, ["domain", "devices", "sound"], null))
}

_arm64_refusals contains ["domain.devices.video.type", sprintf("video model '%s' is not supported on arm64 architecture", [model])] if {
	model := object.get(_spec, ["domain", "devices", "video", "type"], null)
	model != null
	not model in {"virtio", "ramfb"}
}

# Checked by the admitter with dedicated CPUs only.
_arm64_refusals contains ["architecture", sprintf("threads must not be greater than 1 at spec.domain.cpu.threads (got %v) when spec.architecture is arm64", [threads])] if {
	object.get(_spec, ["domain", "cpu", "dedicatedCpuPlacement"], false) == true
	threads := object.get(_spec, ["domain", "cpu", "threads"], 0)
	is_number(threads)
	threads > 1
}

# KubeVirt hotplugs vCPUs only on amd64 (its arm64 converter has no CPU hotplug): the VM still
# gets maxSockets, the domain no headroom.
default cpu_hotplug := false

cpu_hotplug if {
	max_sockets > 0
	architecture == "amd64"
}

# The interfaces and networks: the VM's, or KubeVirt's default pod interface when it has
# neither (unless autoattachPodInterface is false).
default default_pod_interface := false

default_pod_interface if {
	count(_spec_interfaces) == 0
	count(_spec_networks) == 0
	object.get(_spec, ["domain", "devices", "autoattachPodInterface"], true) != false
}

# What virt-api's validating webhook refuses on arm64 (webhooks/arm64.go), refused here with
# its words rather than defaulted into a VM KubeVirt refuses.
_errors contains {"field": field, "message": message} if {
	architecture == "arm64"
	some [field, message] in _arm64_refusals
}

_errors contains {"field": "domain.devices.interfaces", "message": "KubeVirt's default pod interface is bridge, which the cluster does not permit on the pod network (network.permitBridgeInterfaceOnPodNetwork: false)"} if {
	default_pod_interface
	cluster.default_network_interface == "bridge"
	cluster.permit_bridge_on_pod_network == false
}

_default_binding := "masquerade" if cluster.default_network_interface == "masquerade"

else := "bridge"

# The preference's interface model applies to it: KubeVirt adds it before the preference.
_interfaces := [object.union({"name": "default", _default_binding: {}}, _overlay({[["model"], preference_interface_model]}))] if default_pod_interface

else := _spec_interfaces

_networks := [{"name": "default", "pod": {}}] if default_pod_interface

else := _spec_networks

# The virtio model libvirt is given: KubeVirt's non-transitional one (PCIe only) unless the VM
# asks for transitional devices.
virtio_model := "virtio-transitional" if {
	object.get(_spec, ["domain", "devices", "useVirtioTransitional"], false) == true
} else := "virtio-non-transitional"

# The topology KubeVirt gives a VM that sets none of sockets, cores and threads: the CPU limit
# (else request), rounded up, as sockets. The CPU hotplug headroom (maxSockets) a live-update
# cluster adds on top: the cluster's maxCpuSockets, else sockets times the hotplug ratio, at
# most 512 vCPUs.
max_sockets := n if {
	n := object.get(_spec, ["domain", "cpu", "maxSockets"], 0)
	is_number(n)
	n > 0
} else := _hotplug_sockets if {
	cluster.live_update
	architecture == "amd64" # KubeVirt sets up no CPU hotplug on arm64 (defaults.go)
} else := 0

_hotplug_sockets := max([cluster.max_cpu_sockets, _kubevirt_sockets]) if {
	cluster.max_cpu_sockets > 0
} else := max([floor(512 / (topology.cores * topology.threads)), _kubevirt_sockets]) if {
	((_kubevirt_sockets * cluster.max_hotplug_ratio) * topology.cores) * topology.threads > 512
} else := _kubevirt_sockets * cluster.max_hotplug_ratio

# The sockets field as KubeVirt's mutator leaves it: set from the CPU resources when the VM
# sets none of sockets, cores and threads, else as the VM set it (0 when unset: no hotplug).
_kubevirt_sockets := topology.sockets if _no_topology

else := n if {
	n := object.get(_spec, ["domain", "cpu", "sockets"], 0)
	is_number(n)
} else := 0

# The memory hotplug headroom a live-update cluster gives a VM KubeVirt can hotplug memory
# into (amd64, not realtime, no guest mapping passthrough, not encrypted, at least 1Gi of guest
# memory, both sizes aligned to the hotplug block): the cluster's maxGuest, else the guest
# memory times the hotplug ratio; as a quantity in its largest exact binary unit.
max_guest := object.get(_spec, ["domain", "memory", "maxGuest"], null) if {
	object.get(_spec, ["domain", "memory", "maxGuest"], null) != null
} else := kib_quantity(_max_guest_bytes / 1024) if {
	cluster.live_update
	_memory_hotplug_possible
} else := null

_max_guest_bytes := units.parse_bytes(_configuration.liveUpdateConfiguration.maxGuest) if {
	_configuration.liveUpdateConfiguration.maxGuest
} else := (memory_kib * 1024) * cluster.max_hotplug_ratio

_hotplug_alignment := 1073741824 if object.get(_spec, ["domain", "memory", "hugepages", "pageSize"], "") == "1Gi"

else := 2097152

_memory_hotplug_possible if {
	architecture == "amd64"
	object.get(_spec, ["domain", "cpu", "realtime"], null) == null
	object.get(_spec, ["domain", "cpu", "numa", "guestMappingPassthrough"], null) == null
	object.get(_spec, ["domain", "launchSecurity"], null) == null
	guest := memory_kib * 1024
	guest >= 1073741824
	guest % _hotplug_alignment == 0
	guest <= _max_guest_bytes
	_max_guest_bytes % _hotplug_alignment == 0
}
