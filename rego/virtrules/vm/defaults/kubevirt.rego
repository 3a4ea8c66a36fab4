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
# Only amd64 is mirrored; a VM of another architecture is refused as unsupported rather than
# given an amd64 guest.
package virtrules.vm.defaults

_kubevirt := input.kubevirt if is_object(input.kubevirt)

else := {}

_configuration := object.get(_kubevirt, ["spec", "configuration"], {})

# The cluster's configuration as far as it changes a guest: each value as KubeVirt's cluster
# configuration reads it, its built-in default when the KubeVirt CR leaves it unset.
cluster := {
	"architecture": _default_architecture,
	"machine_type": _cluster_machine_type,
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

# The deprecated top-level machineType wins over the per-architecture one, as in KubeVirt.
_cluster_machine_type := mt if {
	mt := _configuration.machineType
	mt != ""
} else := mt if {
	mt := _configuration.architectureConfiguration.amd64.machineType
	mt != ""
} else := "q35"

# The mutated spec's values -----------------------------------------------------------------------

architecture := arch if {
	arch := _spec.architecture
	is_string(arch)
	arch != ""
} else := cluster.architecture

_unsupported contains {"field": "architecture", "message": sprintf("architecture %q: these defaults mirror KubeVirt's amd64 guest only", [architecture])} if {
	architecture != "amd64"
}

# The machine type: the VM's, else the cluster's for its architecture.
machine_type := mt if {
	mt := object.get(_spec, ["domain", "machine", "type"], "")
	mt != ""
} else := cluster.machine_type

# The CPU model: the VM's, else the cluster's, else host-model.
cpu_model := m if {
	m := object.get(_spec, ["domain", "cpu", "model"], "")
	m != ""
} else := cluster.cpu_model if {
	cluster.cpu_model != ""
} else := "host-model"

# KubeVirt's bus for a disk, cdrom or lun without one on amd64: SATA, which every guest OS
# supports out of the box.
default_disk_bus := "sata"

# The interfaces and networks: the VM's, or KubeVirt's default pod interface when it has
# neither (unless autoattachPodInterface is false).
default default_pod_interface := false

default_pod_interface if {
	count(_spec_interfaces) == 0
	count(_spec_networks) == 0
	object.get(_spec, ["domain", "devices", "autoattachPodInterface"], true) != false
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
