# METADATA
# title: VM defaults (1) - what libvirt is asked
# description: |
#   Seed 004's ahead-of-time libvirt defaulting. A VirtualMachine (or VirtualMachineInstance) is
#   translated into a domain, defined in an isolated, throwaway libvirt, read back, and the
#   guest-visible values libvirt chose are written into the VM's own fields (mapping.rego).
#   This file decides what libvirt sees: the `plan`. shape.rego says what a VM's defaults
#   depend on, so that VMs of one template are defaulted once (the defaulter's shape cache).
#
#   Input of `plan`:
#     object:   the VirtualMachine or VirtualMachineInstance as sent (metadata names it)
#     spec:     its VirtualMachineInstance spec (a VM's spec.template.spec); every field path
#               in the answer is relative to it (domain.memory.guest)
#     machines: the machine types the probed QEMU supports, aliases included, by KubeVirt
#               architecture ({"amd64": ["q35", "pc-q35-7.2", ...], "arm64": ["virt", ...]});
#               a list is amd64's
#     request:  optional, what identifies the request creating an object without a name yet
#
#   The rules (seed 004's "defaulting rules"):
#   - abstract sources (PVCs, DataVolumes, container disks, cloud-init, pod and Multus
#     networks, ...) get dummy sources: libvirt never needs them to exist;
#   - values libvirt would pick at random (MAC, firmware UUID) are derived from the object's
#     namespace and name instead, so the same VM always gets the same values;
#   - values KubeVirt derives at run time without a field of libvirt's (disk target names,
#     the vCPU topology from CPU requests, the guest memory from memory requests) are derived
#     as KubeVirt derives them;
#   - everything the user set is passed through unchanged.
package virtrules.vm.defaults

# The answer: errors (invalid input, each {"field", "message"}), unsupported (valid input this
# defaulting cannot handle), warnings (what is left to the node: host devices), the firmware
# UUID and the domain to define. Go renders the domain
# as libvirt XML, adding a unique name and UUID per request.
plan := {
	"errors": sort_by_field(_errors),
	"unsupported": sort_by_field(_unsupported),
	"warnings": sort_by_field(_warnings),
	"firmware_uuid": firmware_uuid,
	"architecture": architecture,
	"efi": default_efi,
	"max_guest": max_guest,
	"cpu": vm_cpu,
	"default_pod_interface": default_pod_interface,
	"pod_interface": _pod_interface,
	"auto_disks": auto_disks,
	"domain": {
		"arch": object.get(architectures, [architecture, "libvirt"], ""),
		"machine": machine_type,
		"memory_kib": memory_kib,
		"vcpus": vcpus,
		"vcpus_current": vcpus_current,
		"vcpus_hotpluggable_from": vcpus_hotpluggable_from,
		"topology": domain_topology,
		"cpu_model": cpu_model,
		"clock": clock,
		"disks": disks,
		"interfaces": array.concat(interfaces, placeholder_interfaces),
		"inputs": inputs,
		"controllers": controllers,
		"memballoon": memballoon,
		"memballoon_free_page_reporting": memballoon_free_page_reporting,
		"rng": is_object(object.get(_spec, ["domain", "devices", "rng"], null)),
		"rng_model": virtio_model,
		"video": video,
		"serial_console": serial_console,
		"channels": channels,
		"watchdog": watchdog,
		"sound": sound,
	},
}

_pod_interface := _interfaces[0] if default_pod_interface

else := null

sort_by_field(errs) := [e |
	some key in sort({sprintf("%s\u0000%s", [x.field, x.message]) | some x in errs})
	[field, message] := split(key, "\u0000")
	e := {"field": field, "message": message}
]

# Input ------------------------------------------------------------------------------------------

# _spec, the spec planned: the VirtualMachineInstance spec given, with the VM's instancetype and
# preference applied as KubeVirt applies them (instancetype.rego).

_metadata := input.object.metadata if is_object(input.object.metadata)

else := {}

_list(path) := value if {
	value := object.get(_spec, path, [])
	is_array(value)
} else := []

_disks := _list(["domain", "devices", "disks"])

_spec_interfaces := _list(["domain", "devices", "interfaces"])

_inputs := _list(["domain", "devices", "inputs"])

_volumes := _list(["volumes"])

_spec_networks := _list(["networks"])

_errors contains {"field": concat(".", path), "message": "must be a list"} if {
	some path in [["domain", "devices", "disks"], ["domain", "devices", "interfaces"], ["domain", "devices", "inputs"], ["volumes"], ["networks"]]
	not is_array(object.get(_spec, path, []))
}

_errors contains {"field": "spec", "message": "must be an object"} if not is_object(input.spec)

# Identity: stable derived values ---------------------------------------------------------------

# What derived values are derived from: namespace/name. An object still without a name (it
# gets one from generateName after admission) is identified by its generateName and
# input.request, what identifies the request creating it (the admission webhook passes the
# admission request's UID, so that replicas from one template differ), or else by the hash of
# its spec, so the same input still gives the same output.
identity := sprintf("%s/%s", [_namespace_identity, _metadata.name]) if {
	is_string(_metadata.name)
	_metadata.name != ""
} else := sprintf("%s/%s%s", [
	_namespace_identity,
	object.get(_metadata, "generateName", ""),
	input.request,
]) if {
	is_string(input.request)
	input.request != ""
} else := sprintf("%s/%s%s", [
	_namespace_identity,
	object.get(_metadata, "generateName", ""),
	crypto.sha256(json.marshal(_spec)),
])

# The namespace as the identity knows it: by its UID when the caller knows it (the admission
# webhook does), so that the same namespace/name in two clusters gets different values, as
# KubeVirt's own random firmware UUIDs would; else (offline) by its name.
_namespace_identity := sprintf("uid:%s", [input.namespace_uid]) if {
	is_string(input.namespace_uid)
	input.namespace_uid != ""
} else := object.get(_metadata, "namespace", "")

# The firmware UUID the user set, or one derived from the identity: an RFC 9562 version 8
# (vendor-specific) UUID made of the identity's SHA-256. libvirt would pick a random one.
firmware_uuid := set_uuid if {
	set_uuid := object.get(_spec, ["domain", "firmware", "uuid"], "")
	set_uuid != ""
} else := derived_uuid(identity)

derived_uuid(id) := sprintf("%s-%s-8%s-%s%s-%s", [
	substring(h, 0, 8), substring(h, 8, 4), substring(h, 13, 3),
	_variant[substring(h, 16, 1)], substring(h, 17, 3), substring(h, 20, 12),
]) if h := crypto.sha256(sprintf("virt-rules/firmware-uuid/%s", [id]))

# The RFC 9562 variant bits (10xx) in the UUID's 17th hex digit.
_variant := {
	"0": "8", "1": "9", "2": "a", "3": "b", "4": "8", "5": "9", "6": "a", "7": "b",
	"8": "8", "9": "9", "a": "a", "b": "b", "c": "8", "d": "9", "e": "a", "f": "b",
}

# A locally administered unicast MAC (02:...) made of the identity and the interface name's
# SHA-256. libvirt would pick a random 52:54:00:... one.
derived_mac(id, iface) := concat(":", ["02", substring(h, 0, 2), substring(h, 2, 2), substring(h, 4, 2), substring(h, 6, 2), substring(h, 8, 2)]) if {
	h := crypto.sha256(sprintf("virt-rules/mac/%s/%s", [id, iface]))
}

_errors contains {"field": "domain.firmware.uuid", "message": sprintf("%q is not a UUID", [set_uuid])} if {
	set_uuid := object.get(_spec, ["domain", "firmware", "uuid"], "")
	set_uuid != ""
	not regex.match(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`, set_uuid)
}

# Machine type ------------------------------------------------------------------------------------

# The machine types of the VM's architecture: input.machines by architecture, or a list, the
# amd64 ones (what callers before arm64 give).
_machines := input.machines if {
	is_array(input.machines)
	architecture == "amd64"
} else := object.get(input.machines, architecture, []) if {
	is_object(input.machines)
} else := []

_errors contains {"field": "domain.machine.type", "message": sprintf("machine type %q is not supported by this QEMU for %s (supported: %s)", [machine_type, architecture, concat(", ", sort(_machines))])} if {
	count(_machines) > 0
	not machine_type in _machines
}

_unsupported contains {"field": "architecture", "message": sprintf("this libvirt has no QEMU for %s guests (%s: install it beside libvirt)", [architecture, packages])} if {
	packages := object.get(architectures, [architecture, "packages"], null)
	packages != null
	count(_machines) == 0
}

# Memory ------------------------------------------------------------------------------------------

# The guest memory as KubeVirt derives it: memory.guest, else the memory request, else the limit.
_memory_path := ["domain", "memory", "guest"] if {
	object.get(_spec, ["domain", "memory", "guest"], null) != null
} else := ["domain", "resources", "requests", "memory"] if {
	object.get(_spec, ["domain", "resources", "requests", "memory"], null) != null
} else := ["domain", "resources", "limits", "memory"] if {
	object.get(_spec, ["domain", "resources", "limits", "memory"], null) != null
}

_memory_field := concat(".", _memory_path)

_memory_value := object.get(_spec, _memory_path, null)

# units.parse_bytes reads every Kubernetes memory quantity (64Mi, 1G, 1.5Gi, 1e9) exactly enough
# for whole KiB, at a fraction of the cost of an exact decimal parse.
memory_kib := ceil(_memory_bytes / 1024) if {
	_memory_bytes > 0
	not _memory_too_large
} else := 0

_memory_bytes := units.parse_bytes(_memory_value)

# More than a 64-bit byte count holds (8Ei): more than any guest, and than libvirt's fields.
_memory_too_large if _memory_bytes > 9223372036854775807

_errors contains {"field": "domain.memory.guest", "message": "the guest needs memory: set domain.memory.guest or domain.resources.requests.memory"} if {
	not _memory_field
}

_errors contains {"field": _memory_field, "message": sprintf("%v is not a positive quantity", [_memory_value])} if {
	memory_kib == 0
	not _memory_too_large
}

_errors contains {"field": _memory_field, "message": sprintf("%v is more memory than any guest can have (at most 8Ei)", [_memory_value])} if {
	_memory_too_large
}

# CPU ---------------------------------------------------------------------------------------------

# KubeVirt's topology: each of sockets, cores and threads as set, else 1; when none is set, the
# CPU limit (else request), rounded up, gives the sockets.
topology := {
	"sockets": _cpu_count("sockets", _cpu_from_resources),
	"cores": _cpu_count("cores", 1),
	"threads": _cpu_count("threads", 1),
}

# What the VM's CPU fields get: KubeVirt's topology and its CPU hotplug headroom.
# The topology is written only where KubeVirt writes it: when the VM sets none of sockets,
# cores and threads.
vm_cpu := object.union(topology, {"max_sockets": max_sockets}) if _no_topology

else := {"max_sockets": max_sockets}

# The domain's topology and vCPUs: with hotplug headroom, maxSockets sockets of which the VM's
# own are enabled; the first socket's vCPUs are never hotpluggable.
domain_topology := object.union(topology, {"sockets": max_sockets}) if cpu_hotplug

else := topology

vcpus := (domain_topology.sockets * domain_topology.cores) * domain_topology.threads

vcpus_current := (topology.sockets * topology.cores) * topology.threads if cpu_hotplug

else := 0

vcpus_hotpluggable_from := topology.cores * topology.threads if cpu_hotplug

else := 0

_cpu_count(key, fallback) := n if {
	n := object.get(_spec, ["domain", "cpu", key], 0)
	is_number(n)
	n >= 1
} else := fallback

_cpu_from_resources := _cpus_of("limits") if {
	_no_topology
	_cpus_of("limits")
} else := _cpus_of("requests") if {
	_no_topology
	_cpus_of("requests")
} else := 1

_no_topology if {
	every key in ["sockets", "cores", "threads"] {
		object.get(_spec, ["domain", "cpu", key], 0) == 0
	}
}

_cpus_of(field) := max([1, ceil(cpus)]) if {
	cpus := units.parse(object.get(_spec, ["domain", "resources", field, "cpu"], null))
}

_errors contains {"field": sprintf("domain.cpu.%s", [key]), "message": sprintf("%v is not a positive whole number", [n])} if {
	some key in ["sockets", "cores", "threads"]
	n := object.get(_spec, ["domain", "cpu", key], 0)
	not _positive_count(n)
}

# More vCPUs than KVM runs in one guest on any host (x86's KVM_MAX_VCPUS, 4096): refused here,
# naming the CPU fields, before a domain with one <vcpu> entry each is built. Below it, the
# machine type's own limit is libvirt's to say.
_max_vcpus := 4096

_errors contains {"field": "domain.cpu", "message": sprintf("%d vCPUs (%d sockets%s x %d cores x %d threads) is more than any guest can have (at most %d)", [
	vcpus, domain_topology.sockets, _headroom_note, domain_topology.cores, domain_topology.threads, _max_vcpus,
])} if {
	vcpus > _max_vcpus
}

_headroom_note := ", maxSockets with the CPU hotplug headroom," if cpu_hotplug

else := ""

_positive_count(0)

_positive_count(n) if {
	is_number(n)
	n >= 1
	n == round(n)
}

# Clock: the offset the user chose; libvirt's default otherwise.
clock := {"offset": "timezone", "timezone": tz} if {
	tz := object.get(_spec, ["domain", "clock", "timezone"], null)
	is_string(tz)
} else := {"offset": "utc"} if {
	is_object(object.get(_spec, ["domain", "clock", "utc"], null))
} else := null

# Disks and their volumes -------------------------------------------------------------------------

# The disk kinds KubeVirt has, the bus each defaults to (KubeVirt's amd64 default for all), and
# the buses it allows.
_disk_kinds := {"disk": default_disk_bus, "cdrom": default_disk_bus, "lun": default_disk_bus}

_buses := {"virtio": "vd", "sata": "sd", "scsi": "sd", "usb": "sd"}

# Abstract volume sources: each gets a dummy source; none needs to exist.
abstract_volume_sources := {
	"persistentVolumeClaim", "dataVolume", "containerDisk", "ephemeral", "emptyDisk", "hostDisk",
	"cloudInitNoCloud", "cloudInitConfigDrive", "configMap", "secret", "serviceAccount",
	"sysprep", "downwardAPI", "downwardMetrics", "memoryDump",
}

# A lun is a block device; every other disk a file.
dummy_source(kind, volume) := {"type": "block", "path": sprintf("/dev/virt-rules-dummy/%s", [volume])} if kind == "lun"

else := {"type": "file", "path": sprintf("/virt-rules-dummy/volumes/%s", [volume])}

# The disks KubeVirt's mutating webhook adds, one per volume that no disk or filesystem
# names: a plain disk on the default bus.
_disk_and_fs_names contains x.name if some x in array.concat(_disks, _list(["domain", "devices", "filesystems"]))

auto_disks := [{"name": v.name} | some v in _volumes; not v.name in _disk_and_fs_names]

_all_disks := array.concat(_disks, auto_disks)

_disk_kind(disk) := kind if {
	some kind in object.keys(_disk_kinds)
	is_object(disk[kind])
} else := "disk"

_disk_bus(disk) := bus if {
	bus := disk[_disk_kind(disk)].bus
	is_string(bus)
} else := _disk_kinds[_disk_kind(disk)]

# libvirt allows device='lun' on scsi and virtio only; KubeVirt defaults a LUN's bus to sata and
# admits it, and the VM never starts. Said here with the field at fault rather than left to
# libvirt's message, which names no disk.
_errors contains {"field": sprintf("domain.devices.disks[%d].lun.bus", [i]), "message": msg} if {
	some i, disk in _disks
	_kinds[i] == "lun"
	not _disk_buses[i] in {"scsi", "virtio"}
	msg := sprintf("a LUN on bus %q: libvirt allows device='lun' only on scsi or virtio (KubeVirt's default bus is sata); set bus: scsi", [_disk_buses[i]])
}

_volume_names contains v.name if some v in _volumes

# Each disk's kind and bus, computed once.
_kinds := [_disk_kind(disk) | some disk in _all_disks]

_disk_buses := [_disk_bus(disk) | some disk in _all_disks]

disks := [d |
	some i, disk in _all_disks
	kind := _kinds[i]
	bus := _disk_buses[i]
	d := {
		"alias": sprintf("ua-disk%d", [i]),
		"device": kind,
		"bus": bus,
		"dev": _dev_name(i, bus),
		"source": dummy_source(kind, object.get(disk, "name", "")),
		"readonly": _readonly(disk, kind),
		"pci": object.get(disk, [kind, "pciAddress"], ""),
		"boot_order": object.get(disk, "bootOrder", 0),
		"serial": object.get(disk, "serial", ""),
		"model": _disk_model(bus),
	}
]

_disk_model("virtio") := virtio_model

_disk_model(bus) := "" if bus != "virtio"

default _readonly(_, _) := false

_readonly(_, "cdrom") := true

_readonly(disk, kind) if {
	kind != "cdrom"
	object.get(disk, [kind, "readonly"], false) == true
}

# KubeVirt's target names: the bus's prefix (vd, sd) and the disk's rank among the disks with
# that prefix as letters (a..z, then aa, ab, ...).
_dev_name(i, bus) := concat("", [_buses[bus], _letters(rank)]) if {
	rank := count([j | some j, other in _disk_buses; j < i; _buses[other] == _buses[bus]])
}

_alphabet := "abcdefghijklmnopqrstuvwxyz"

_letters(n) := substring(_alphabet, n, 1) if n < 26

else := concat("", [substring(_alphabet, floor(n / 26) - 1, 1), substring(_alphabet, n % 26, 1)])

# KubeVirt's disk admitter refuses a virtio CD-ROM (on every architecture). On arm64 that is
# also where KubeVirt's mutator puts a CD-ROM without a bus, so such a VM never starts.
_errors contains {"field": sprintf("domain.devices.disks[%d].cdrom.bus", [i]), "message": concat("", ["Bus type virtio is invalid for CD-ROM device", hint])} if {
	some i, bus in _disk_buses
	_kinds[i] == "cdrom"
	bus == "virtio"
	hint := _cdrom_hint(_disks[i])
}

_cdrom_hint(disk) := " (KubeVirt's arm64 default for a CD-ROM without a bus: give it bus scsi)" if {
	object.get(disk, ["cdrom", "bus"], "") == ""
} else := ""

_errors contains {"field": field, "message": sprintf("bus %q is not one of %s", [bus, concat(", ", sort(object.keys(_buses)))])} if {
	some i, bus in _disk_buses
	not _buses[bus]
	field := sprintf("domain.devices.disks[%d].%s.bus", [i, _kinds[i]])
}

_errors contains {"field": sprintf("domain.devices.disks[%d].name", [i]), "message": "no volume has this disk's name"} if {
	some i, disk in _disks
	not object.get(disk, "name", "") in _volume_names
}

_unsupported contains {"field": sprintf("volumes[%d]", [i]), "message": sprintf("volume source %s has no dummy source for defaulting", [concat(", ", sort(kinds))])} if {
	some i, volume in _volumes
	kinds := object.keys(object.remove(volume, {"name"}))
	count(kinds - abstract_volume_sources) > 0
}

# KubeVirt's controllers: USB (model none unless something needs USB), virtio-scsi (for
# hotplug, unless disabled, or for SCSI disks) and virtio-serial (with the serial console).
controllers := array.flatten([
	[{"type": "usb", "index": 0, "model": _usb_model}],
	[{"type": "scsi", "index": 0, "model": virtio_model} | _scsi_controller],
	[{"type": "virtio-serial", "index": 0, "model": virtio_model} | serial_console],
	[{"type": "pci", "index": bus, "model": "pcie-to-pci-bridge"} | some bus in sort(_bridge_buses)],
])

# A device at a PCI address whose slot is not 0 on a bus other than the root complex's sits
# behind a pcie-to-pci-bridge: where libvirt puts a conventional PCI device (an e1000 NIC) on
# q35, and so where the defaults put it. Given that address back (a VMI of a defaulted VM),
# libvirt would add a root port for the bus, which has slot 0 only; the bus is planned as the
# bridge it was.
_bridge_buses contains bus if {
	some pci in _pci_fields
	regex.match(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`, pci)
	bus := _hex_byte(substring(pci, 5, 2))
	bus > 0
	_hex_byte(substring(pci, 8, 2)) > 0
}

_hex_byte(s) := (16 * indexof("0123456789abcdef", substring(lower(s), 0, 1))) + indexof("0123456789abcdef", substring(lower(s), 1, 1))

_usb_model := "qemu-xhci" if _usb_needed

else := "none"

# On arm64 KubeVirt always adds the USB controller (its arm64 converter's IsUSBNeeded), for
# the tablet and keyboard it always gives the guest there.
_usb_needed if architecture == "arm64"

_usb_needed if {
	some device in _inputs
	object.get(device, "bus", "") in {"usb", ""}
}

_usb_needed if "usb" in _disk_buses

_usb_needed if is_object(object.get(_spec, ["domain", "devices", "clientPassthrough"], null))

_scsi_controller if object.get(_spec, ["domain", "devices", "disableHotplug"], false) != true

_scsi_controller if "scsi" in _disk_buses

# Interfaces and their networks -------------------------------------------------------------------

# Abstract network sources: each interface gets a dummy ethernet source.
abstract_network_sources := {"pod", "multus"}

_network_names contains n.name if some n in _networks

# Bindings that are a host device, not a libvirt interface: not defaulted.
passthrough_bindings := {"sriov"}

interfaces := [x |
	some i, iface in _interfaces
	not _passthrough(iface)
	name := object.get(iface, "name", "")
	x := {
		"alias": sprintf("ua-net%d", [i]),
		"mac": _mac(iface, name),
		"model": _nic_model(object.get(iface, "model", "virtio")),
		"pci": object.get(iface, "pciAddress", ""),
		"boot_order": object.get(iface, "bootOrder", 0),
		"rom_disabled": object.get(iface, "bootOrder", 0) == 0,
		"source": {"type": "ethernet"},
	}
]

_nic_model("virtio") := virtio_model

_nic_model(model) := model if model != "virtio"

# virt-launcher reserves PCIe root ports for hotplugging NICs: it defines the domain with
# placeholder NICs after the VM's own (4 NICs in all), keeps the ports libvirt gave them and
# drops the NICs. A VM without NICs gets none.
placeholder_interfaces := [x |
	_placeholders > 0
	some i in numbers.range(0, _placeholders - 1)
	x := {
		"alias": sprintf("placeholder-%d", [i]),
		"mac": derived_mac(identity, sprintf("placeholder-%d", [i])),
		"model": virtio_model,
		"pci": "",
		"boot_order": 0,
		"rom_disabled": false,
		"source": {"type": "ethernet"},
	}
]

_placeholders := max([0, 4 - count(_interfaces)]) if count(_interfaces) > 0

else := 0

_mac(iface, name) := iface.macAddress if is_string(iface.macAddress)

else := derived_mac(identity, name)

_passthrough(iface) if {
	some binding in passthrough_bindings
	is_object(iface[binding])
}

# Host devices (SR-IOV VFs, GPUs, other host devices) are the node's: which device, whether PCI,
# mediated or USB, is known only where the VM starts, and libvirt places them then, after every
# NIC and disk (so the addresses written for those stand). Nothing is written for them; each
# value left to the node is a warning, so that no partial default is silent.
_warnings contains {"field": sprintf("domain.devices.interfaces[%d].pciAddress", [i]), "message": "an SR-IOV VF is a host device: libvirt places it when the VM starts on a node; set pciAddress to pin its guest address"} if {
	some i, iface in _interfaces
	_passthrough(iface)
	object.get(iface, "pciAddress", "") == ""
}

_warnings contains {"field": sprintf("domain.devices.interfaces[%d].macAddress", [i]), "message": "an SR-IOV VF gets its MAC from the SR-IOV CNI on the node; set macAddress to pin it"} if {
	some i, iface in _interfaces
	_passthrough(iface)
	object.get(iface, "macAddress", "") == ""
}

_warnings contains {"field": sprintf("domain.devices.gpus[%d]", [i]), "message": "a GPU is the node's (PCI or mediated): libvirt places it when the VM starts; KubeVirt has no field for its guest address"} if {
	some i, _ in _list(["domain", "devices", "gpus"])
}

_warnings contains {"field": sprintf("domain.devices.hostDevices[%d]", [i]), "message": "a host device is the node's (PCI, mediated or USB): libvirt places it, and a USB controller for a USB one, when the VM starts; KubeVirt has no field for its guest address"} if {
	some i, _ in _list(["domain", "devices", "hostDevices"])
}

_errors contains {"field": sprintf("domain.devices.interfaces[%d].name", [i]), "message": "no network has this interface's name"} if {
	some i, iface in _interfaces
	not object.get(iface, "name", "") in _network_names
}

_unsupported contains {"field": sprintf("networks[%d]", [i]), "message": sprintf("network source %s has no dummy source for defaulting", [concat(", ", sort(kinds))])} if {
	some i, network in _networks
	kinds := object.keys(object.remove(network, {"name"}))
	count(kinds - abstract_network_sources) > 0
}

_errors contains {"field": sprintf("domain.devices.interfaces[%d].macAddress", [i]), "message": sprintf("%q is not a unicast MAC address like 02:00:00:00:00:01", [mac])} if {
	some i, iface in _interfaces
	mac := object.get(iface, "macAddress", "")
	not _unicast_mac(mac)
}

_unicast_mac(mac) if {
	regex.match(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`, mac)

	# The multicast bit is the lowest of the first octet.
	lower(substring(mac, 1, 1)) in {"0", "2", "4", "6", "8", "a", "c", "e"}
}

_unicast_mac("")

_errors contains {"field": field, "message": sprintf("%q is not a PCI address like 0000:01:00.0", [pci])} if {
	some field, pci in _pci_fields
	not regex.match(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`, pci)
}

_pci_fields[sprintf("domain.devices.interfaces[%d].pciAddress", [i])] := iface.pciAddress if {
	some i, iface in _interfaces
	iface.pciAddress != ""
}

_pci_fields[sprintf("domain.devices.disks[%d].disk.pciAddress", [i])] := disk.disk.pciAddress if {
	some i, disk in _disks
	disk.disk.pciAddress != ""
}

# Inputs, balloon, and the devices KubeVirt always adds ------------------------------------------

# Tablets, on USB unless the VM says virtio; on arm64, after them, the USB tablet (unless the
# VM has a tablet) and keyboard KubeVirt's converter always adds there, without an alias: they
# are no field of the VM.
inputs := array.concat(_vm_inputs, _arch_inputs)

_vm_inputs := [x |
	some i, device in _inputs
	x := {"alias": sprintf("ua-input%d", [i]), "type": object.get(device, "type", "tablet"), "bus": _input_bus(device)}
]

_arch_inputs := array.concat(
	[{"alias": "", "type": "tablet", "bus": "usb"} | not _has_tablet],
	[{"alias": "", "type": "keyboard", "bus": "usb"}],
) if architecture == "arm64"

else := []

_has_tablet if {
	some x in _vm_inputs
	x.type == "tablet"
}

_input_bus(device) := bus if {
	bus := device.bus
	bus != ""
} else := "usb"

# autoattachMemBalloon false means no balloon; otherwise KubeVirt's virtio one, with free page
# reporting unless the cluster disables it.
memballoon := "none" if object.get(_spec, ["domain", "devices", "autoattachMemBalloon"], true) == false

else := virtio_model

memballoon_free_page_reporting := "" if memballoon == "none"

else := "on" if {
	cluster.free_page_reporting
	not _dedicated_or_hugepages
} else := "off"

_dedicated_or_hugepages if object.get(_spec, ["domain", "cpu", "dedicatedCpuPlacement"], false) == true

_dedicated_or_hugepages if is_object(object.get(_spec, ["domain", "memory", "hugepages"], null))

_dedicated_or_hugepages if is_object(object.get(_spec, ["domain", "cpu", "realtime"], null))

# The VGA card KubeVirt gives every VM with graphics (the model the VM names, if any); on
# arm64 a virtio GPU, the only display QEMU's arm64 machines have.
video := null if object.get(_spec, ["domain", "devices", "autoattachGraphicsDevice"], true) == false

else := {"model": model, "vram": 16384, "heads": 1} if {
	model := _spec.domain.devices.video.type
	is_string(model)
} else := {"model": "virtio", "vram": 0, "heads": 1} if {
	architecture == "arm64"
} else := {"model": "vga", "vram": 16384, "heads": 1}

# The serial console: an ISA serial port and, for it, the virtio-serial controller.
default serial_console := false

serial_console if object.get(_spec, ["domain", "devices", "autoattachSerialConsole"], true) != false

# The guest agent's virtio channel, always; the downward metrics one with that device.
channels := array.concat(["org.qemu.guest_agent.0"], ["org.github.vhostmd.1" | is_object(object.get(_spec, ["domain", "devices", "downwardMetrics"], null))])

watchdog := {"model": "i6300esb", "action": object.get(_spec, ["domain", "devices", "watchdog", "i6300esb", "action"], "reset")} if {
	is_object(object.get(_spec, ["domain", "devices", "watchdog"], null))
} else := null

sound := {"model": object.get(_spec, ["domain", "devices", "sound", "model"], "ich9")} if {
	is_object(object.get(_spec, ["domain", "devices", "sound"], null))
} else := null
