# VM defaults (2) - what comes back (package documentation in plan.rego).
#
# Which values of the domain libvirt defined go back into which fields of the VM, and which
# are backend-only and never do.
#
# Input of `defaults`:
#   spec:   the VirtualMachineInstance spec that was planned (as in plan.rego), with the
#           object, instancetype and preference it was planned with
#   plan:   the plan's answer for it
#   domain: the inactive domain XML libvirt returned, as a tree: each element an object with
#           its attributes as "@name" keys, its text as "#text" and its child elements as
#           lists under their tag names
#
# The answer is a list of {"path", "value"}: a field of the spec (a list of keys and list
# indexes) the user left unset, and its value. Set fields are never in it.
package virtrules.vm.defaults

# Backend-only --------------------------------------------------------------------------------

# Domain elements that are this libvirt's bookkeeping: the per-request name and UUID, security
# labels, resource partitions.
backend_only_domain_elements := {"name", "uuid", "seclabel", "resource", "metadata", "title", "description"}

# Devices that are the host's side only: the emulator binary, the audio backend.
backend_only_devices := {"emulator", "audio"}

# Parts of any device that are the host's side: dummy sources, drivers and backends (paths,
# formats), aliases.
backend_only_device_elements := {"source", "driver", "backend", "alias"}

# The domain without anything backend-only. The mappings below read the same, element by
# element: through _gv, _visible_devices and _by_alias, which drop what is backend-only.
guest_visible := object.union(object.remove(_domain, backend_only_domain_elements | {"devices"}), {"devices": [_guest_visible_devices]})

_domain := input.domain if is_object(input.domain)

else := {}

_raw_devices := object.get(_domain, ["devices", 0], {})

_guest_visible_devices[kind] := [object.remove(d, backend_only_device_elements) | some d in list] if {
	some kind, list in _raw_devices
	not kind in backend_only_devices
	is_array(list)
}

# The guest-visible part of every disk, interface and input (the devices the mapping reads by
# the plan's aliases: ua-disk0, ua-net1, ...), by alias; computed once.
_by_alias[alias] := object.remove(d, backend_only_device_elements) if {
	some kind in ["disk", "interface", "input"]
	some d in object.get(_raw_devices, kind, [])
	alias := d.alias[0]["@name"]
}

# A guest-visible domain element (not under devices) at path, else null.
_gv(path) := object.get(_domain, path, null) if not path[0] in _not_top_level_visible

_not_top_level_visible := backend_only_domain_elements | {"devices"}

# The guest-visible part of every device of kind.
_visible_devices(kind) := [object.remove(d, backend_only_device_elements) | some d in object.get(_raw_devices, kind, [])] if {
	not kind in backend_only_devices
}

# The mapping ---------------------------------------------------------------------------------

# The rule's name repeats the package's: vm.defaults.defaults is a shipped entrypoint (a public
# contract, engine/decisions.go).
# regal ignore:rule-name-repeats-package
defaults := [{"path": path, "value": value} |
	some [path, value] in sort(_candidates)
	value != null
	_writable(path)
]

# A field the VM may carry: unset in the VM, and neither its instancetype nor its preference
# gives it (instancetype.rego). Input here also has plan's object, instancetype and preference.
_writable(path) if {
	object.get(input.spec, path, null) == null
	object.get(_spec, path, null) == null
	not left_to_reference(path)
}

# The architecture KubeVirt's mutating webhook records: the VM's guest is built for it.
_candidates contains [["architecture"], input.plan.architecture]

# The machine type KubeVirt chose (the VM's, or the cluster's), not the versioned one this
# libvirt's QEMU expands it to: the nodes' QEMU may expand it differently, and KubeVirt
# schedules by the name.
_candidates contains [["domain", "machine", "type"], input.plan.domain.machine]

_candidates contains [["domain", "memory", "guest"], kib_quantity(to_number(text))] if {
	_gv(["memory", 0, "@unit"]) == "KiB"
	text := _gv(["memory", 0, "#text"])
}

# The topology as KubeVirt derives it, and the CPU hotplug headroom it adds (libvirt's
# topology counts maxSockets sockets).
_candidates contains [["domain", "cpu", key], value] if {
	some key in ["sockets", "cores", "threads"]
	value := input.plan.cpu[key]
	value
}

_candidates contains [["domain", "cpu", "maxSockets"], input.plan.cpu.max_sockets] if {
	input.plan.cpu.max_sockets > 0
}

_candidates contains [["domain", "cpu", "model"], model] if {
	_gv(["cpu", 0, "@mode"]) == "custom"
	model := _gv(["cpu", 0, "model", 0, "#text"])
}

_candidates contains [["domain", "cpu", "model"], mode] if {
	some mode in ["host-model", "host-passthrough"]
	_gv(["cpu", 0, "@mode"]) == mode
}

# No clock: KubeVirt defines none unless the VM sets one (libvirt's default is UTC), and a VM
# with clock.utc gets a different domain (its RTC adjustment reset at start).

# KubeVirt's memory hotplug headroom.
_candidates contains [["domain", "memory", "maxGuest"], input.plan.max_guest] if input.plan.max_guest != null

# The bootloader KubeVirt's mutator gives an arm64 VM that names none: UEFI, no secure boot.
_candidates contains [["domain", "firmware", "bootloader", "efi", "secureBoot"], false] if input.plan.efi == true

# libvirt's UUID is per request: the firmware UUID is the plan's (derived or the user's).
_candidates contains [["domain", "firmware", "uuid"], input.plan.firmware_uuid]

# A balloon libvirt adds is what KubeVirt's autoattachMemBalloon adds.
_candidates contains [["domain", "devices", "autoattachMemBalloon"], true] if {
	some balloon in _visible_devices("memballoon")
	balloon["@model"] != "none"
}

_candidates contains [["domain", "devices", "disks", i, kind, "bus"], disk.target[0]["@bus"]] if {
	some i, planned in input.plan.domain.disks
	disk := _by_alias[planned.alias]
	kind := planned.device
}

_candidates contains [["domain", "devices", "disks", i, "disk", "pciAddress"], pci_address(disk.address[0])] if {
	some i, planned in input.plan.domain.disks
	planned.device == "disk"
	disk := _by_alias[planned.alias]
}

_candidates contains [["domain", "devices", "disks", i, "cdrom", "readonly"], true] if {
	some i, planned in input.plan.domain.disks
	planned.device == "cdrom"
	disk := _by_alias[planned.alias]
	disk.readonly
}

_candidates contains [["domain", "devices", "interfaces", i, "macAddress"], iface.mac[0]["@address"]] if {
	some i, iface in _interfaces_by_index
}

_candidates contains [["domain", "devices", "interfaces", i, "model"], _kubevirt_nic_model(iface.model[0]["@type"])] if {
	some i, iface in _interfaces_by_index
}

# KubeVirt's name for libvirt's virtio models.
_kubevirt_nic_model(model) := "virtio" if model in {"virtio-non-transitional", "virtio-transitional", "virtio"}

else := model

# KubeVirt's default pod interface and network, when the VM has neither.
_candidates contains [["domain", "devices", "interfaces", 0, key], value] if {
	input.plan.default_pod_interface
	some key, value in input.plan.pod_interface
}

_candidates contains [["networks", 0, key], value] if {
	input.plan.default_pod_interface
	some key, value in {"name": "default", "pod": {}}
}

# The disks KubeVirt adds for volumes without one.
_candidates contains [["domain", "devices", "disks", i, "name"], disk.name] if {
	some j, disk in input.plan.auto_disks
	i := count(object.get(input.spec, ["domain", "devices", "disks"], [])) + j
}

_candidates contains [["domain", "devices", "interfaces", i, "pciAddress"], pci_address(iface.address[0])] if {
	some i, iface in _interfaces_by_index
}

_candidates contains [["domain", "devices", "inputs", i, "bus"], device["@bus"]] if {
	some i, planned in input.plan.domain.inputs
	device := _by_alias[planned.alias]
}

# Interfaces by their index in the spec: passthrough ones are not in the plan, so the alias
# (ua-net<i>) carries the index.
_interfaces_by_index[to_number(trim_prefix(planned.alias, "ua-net"))] := _by_alias[planned.alias] if {
	some planned in input.plan.domain.interfaces
}

# Formats ---------------------------------------------------------------------------------------

# A libvirt PCI address as KubeVirt writes one: 0000:01:00.0.
pci_address(address) := sprintf("%s:%s:%s.%s", [
	_hex(address["@domain"], 4), _hex(address["@bus"], 2),
	_hex(address["@slot"], 2), _hex(address["@function"], 1),
]) if address["@type"] == "pci"

_hex(value, width) := concat("", [substring("0000", 0, width - count(digits)), digits]) if {
	digits := lower(trim_prefix(value, "0x"))
	count(digits) <= width
}

# KiB as the largest binary unit that divides it exactly.
kib_quantity(kib) := sprintf("%dGi", [kib / 1048576]) if kib % 1048576 == 0

else := sprintf("%dMi", [kib / 1024]) if kib % 1024 == 0

else := sprintf("%dKi", [kib])
