# VM defaults (0) - a VM's instancetype and preference, applied as KubeVirt applies them
# (package documentation in plan.rego).
#
# A VirtualMachine with spec.instancetype or spec.preference gets its guest from them when
# KubeVirt starts it: virt-api's VM mutating webhook first takes the preference's architecture
# and machine type into the VM itself, then virt-controller applies the preference's auto-attach
# devices, then the instancetype (its values win, and a VM that sets one of them is refused:
# a conflict), then the rest of the preference (it fills only what the VM leaves unset). This
# file mirrors KubeVirt v1.8's pkg/instancetype/apply and pkg/instancetype/preference/apply:
# `_spec`, the spec every other rule plans, is the spec after these steps.
#
# What goes back into the VM is what neither the VM, nor its instancetype, nor its preference
# states (mapping.rego): KubeVirt refuses a VM that sets what its instancetype sets, and a
# value the preference gives stays the preference's. A warning per reference names the fields
# left to it.
#
# Input read here (besides plan.rego's):
#   instancetype: the VM's instancetype as the caller found it, {"kind", "name", "revision",
#                 "spec"}: the ControllerRevision the VM is pinned to (revision its name), else
#                 the object spec.instancetype names; absent when the VM has none
#   preference:   the same for spec.preference
package virtrules.vm.defaults

_given_spec := input.spec if is_object(input.spec)

else := {}

# The references of a VM (a VMI has none: KubeVirt expanded its VM's before creating it).
_reference(ref) := r if {
	input.object.kind == "VirtualMachine"
	r := object.get(input.object, ["spec", ref], null)
	r != null
}

_referenced(ref) := {"instancetype": "VirtualMachineClusterInstancetype", "preference": "VirtualMachineClusterPreference"}[ref] if {
	object.get(_reference(ref), "kind", "") == ""
} else := _reference(ref).kind

# The spec of each reference given, and how to name it.
_given(ref) := input[ref] if {
	_reference(ref)
	is_object(input[ref])
	is_object(input[ref].spec)
}

_instancetype := s if s := _given("instancetype").spec

else := {}

_preference := s if s := _given("preference").spec

else := {}

_named(ref) := sprintf("%s %s (revision %s)", [_referenced(ref), _given(ref).name, _given(ref).revision]) if {
	object.get(_given(ref), "revision", "") != ""
} else := sprintf("%s %s", [_referenced(ref), object.get(_given(ref), "name", "")])

_unsupported contains {"field": sprintf("spec.%s.inferFromVolume", [ref]), "message": sprintf("the %s is inferred from volume %q when KubeVirt admits the VM: default the VM as KubeVirt stored it, with spec.%s.name", [ref, r.inferFromVolume, ref])} if {
	some ref in ["instancetype", "preference"]
	r := _reference(ref)
	object.get(r, "name", "") == ""
	object.get(r, "inferFromVolume", "") != ""
}

_errors contains {"field": sprintf("spec.%s.name", [ref]), "message": sprintf("%s %q was not given: the guest it gives cannot be planned", [_referenced(ref), r.name])} if {
	some ref in ["instancetype", "preference"]
	r := _reference(ref)
	object.get(r, "name", "") != ""
	not _given(ref)
}

# The expansion, step by step -----------------------------------------------------------------

_spec := _given_spec if {
	not _given("instancetype")
	not _given("preference")
} else := _expanded

# virt-api's VM mutating webhook: the preference's architecture and machine type, where the VM
# has none.
_mutated := object.union(_overlay(_pref_vm_values), _given_spec)

_pref_vm_values contains [["architecture"], _non_empty(object.get(_preference, "preferredArchitecture", ""))]

_pref_vm_values contains [["domain", "machine", "type"], _non_empty(object.get(_preference, ["machine", "preferredMachineType"], ""))]

# virt-controller, before the instancetype: the preference's auto-attach devices.
_auto_attached := object.union(_overlay(_auto_attach_values), _mutated)

_auto_attach_values contains [["domain", "devices", field], object.get(_preference, ["devices", preferred], null)] if {
	some field, preferred in {
		"autoattachGraphicsDevice": "preferredAutoattachGraphicsDevice",
		"autoattachMemBalloon": "preferredAutoattachMemBalloon",
		"autoattachPodInterface": "preferredAutoattachPodInterface",
		"autoattachSerialConsole": "preferredAutoattachSerialConsole",
		"autoattachInputDevice": "preferredAutoattachInputDevice",
	}
}

# The instancetype: its values over the VM's (a VM setting one is a conflict, below).
_with_instancetype := object.union(_auto_attached, _instancetype_overlay) if _given("instancetype")

else := _auto_attached

_instancetype_overlay := _overlay(_instancetype_values)

_instancetype_values contains [["domain", "cpu", key], n] if {
	_given("instancetype")
	some key, n in object.union({"sockets": 1, "cores": 1, "threads": 1}, _laid_out(_vcpus, _preferred_topology))
}

_instancetype_values contains [path, object.get(_instancetype, own, null)] if {
	some [path, own] in [
		[["nodeSelector"], ["nodeSelector"]],
		[["domain", "cpu", "model"], ["cpu", "model"]],
		[["domain", "cpu", "dedicatedCpuPlacement"], ["cpu", "dedicatedCPUPlacement"]],
		[["domain", "cpu", "isolateEmulatorThread"], ["cpu", "isolateEmulatorThread"]],
		[["domain", "cpu", "numa"], ["cpu", "numa"]],
		[["domain", "cpu", "realtime"], ["cpu", "realtime"]],
		[["domain", "cpu", "maxSockets"], ["cpu", "maxSockets"]],
		[["domain", "memory", "guest"], ["memory", "guest"]],
		[["domain", "memory", "hugepages"], ["memory", "hugepages"]],
		[["domain", "memory", "maxGuest"], ["memory", "maxGuest"]],
		[["domain", "ioThreads", "supplementalPoolThreadCount"], ["ioThreads", "supplementalPoolThreadCount"]],
		[["domain", "ioThreadsPolicy"], ["ioThreadsPolicy"]],
		[["domain", "launchSecurity"], ["launchSecurity"]],
	]
}

_instancetype_values contains [["schedulerName"], _non_empty(object.get(_instancetype, "schedulerName", ""))]

_instancetype_values contains [["domain", "devices", kind], _non_empty_list(object.get(_instancetype, kind, []))] if {
	some kind in ["gpus", "hostDevices"]
}

_instancetype_values contains [["domain", "resources", "requests", "memory"], _overcommitted_request]

# The guest's vCPUs as the preference's topology lays them out (1 socket, core and thread each
# otherwise).
_vcpus := object.get(_instancetype, ["cpu", "guest"], 1)

_preferred_topology := t if {
	t := object.get(_preference, ["cpu", "preferredCPUTopology"], "")
	t != ""
} else := "sockets"

_laid_out(1, _) := {}

_laid_out(n, t) := {"cores": n} if {
	n != 1
	t in {"cores", "preferCores"}
}

_laid_out(n, t) := {"sockets": n} if {
	n != 1
	t in {"sockets", "preferSockets", "any", "preferAny"}
}

_laid_out(n, t) := {"threads": n} if {
	n != 1
	t in {"threads", "preferThreads"}
}

_laid_out(n, t) := {"cores": _spread_ratio, "sockets": n / _spread_ratio} if {
	n != 1
	t in {"spread", "preferSpread"}
	_spread_across == "SocketsCores"
}

_laid_out(n, t) := {"threads": _spread_ratio, "cores": n / _spread_ratio} if {
	n != 1
	t in {"spread", "preferSpread"}
	_spread_across == "CoresThreads"
}

_laid_out(n, t) := {"threads": 2, "cores": _spread_ratio, "sockets": (n / 2) / _spread_ratio} if {
	n != 1
	t in {"spread", "preferSpread"}
	_spread_across == "SocketsCoresThreads"
}

_spread_ratio := r if {
	r := object.get(_preference, ["cpu", "spreadOptions", "ratio"], 0)
	r > 0
} else := r if {
	r := object.get(_preference, "preferSpreadSocketToCoreRatio", 0)
	r > 0
} else := 2

_spread_across := object.get(_preference, ["cpu", "spreadOptions", "across"], "SocketsCores")

# KubeVirt's check of a spread topology: the vCPUs must divide as the preference spreads them.
_errors contains {"field": "spec.instancetype", "message": sprintf("%s has %d vCPUs, which the spread topology of %s (%s, ratio %d) cannot lay out: KubeVirt refuses the VM", [_named("instancetype"), _vcpus, _named("preference"), _spread_across, _spread_ratio])} if {
	_given("instancetype")
	_preferred_topology in {"spread", "preferSpread"}
	not _spreads
}

_spreads if {
	_spread_across in {"SocketsCores", "CoresThreads"}
	_vcpus % _spread_ratio == 0
}

_spreads if {
	_spread_across == "SocketsCoresThreads"
	_vcpus % 2 == 0
	(_vcpus / 2) % _spread_ratio == 0
}

# An overcommitted instancetype's pod asks for that much less memory than the guest has.
_overcommitted_request := sprintf("%d", [floor(units.parse_bytes(guest) * (1 - (percent / 100)))]) if {
	percent := object.get(_instancetype, ["memory", "overcommitPercent"], 0)
	percent > 0
	guest := _instancetype.memory.guest
} else := null

# The fields of the VM its instancetype owns: KubeVirt's conflicts (pkg/instancetype/apply).
_conflicts contains path if {
	some path in [
		["domain", "resources", "requests", "cpu"], ["domain", "resources", "limits", "cpu"],
		["domain", "resources", "requests", "memory"], ["domain", "resources", "limits", "memory"],
		["domain", "memory", "guest"],
	]
	object.get(_given_spec, path, null) != null
}

_conflicts contains ["domain", "cpu", key] if {
	some key in ["sockets", "cores", "threads"]
	not object.get(_given_spec, ["domain", "cpu", key], 0) in {0, null}
}

_conflicts contains path if {
	some path in [
		["domain", "cpu", "model"], ["domain", "cpu", "dedicatedCpuPlacement"],
		["domain", "cpu", "isolateEmulatorThread"], ["domain", "cpu", "numa"], ["domain", "cpu", "realtime"],
		["domain", "memory", "hugepages"], ["domain", "memory", "maxGuest"],
		["domain", "ioThreads", "supplementalPoolThreadCount"], ["domain", "ioThreadsPolicy"],
		["domain", "launchSecurity"], ["nodeSelector"], ["schedulerName"],
		["domain", "devices", "gpus"], ["domain", "devices", "hostDevices"],
	]
	object.get(_instancetype_overlay, path, null) != null
	not object.get(_given_spec, path, null) in {null, false, "", []}
}

_errors contains {"field": concat(".", path), "message": sprintf("%s sets it: KubeVirt refuses a VM that sets what its instancetype sets (a conflict); leave it unset", [_named("instancetype")])} if {
	_given("instancetype")
	some path in _conflicts
}

# The preference: what the VM (and its instancetype) leave unset. ---------------------------

_expanded := object.union(_with_instancetype, _overlay(_preference_values)) if _given("preference")

else := _with_instancetype

_devices := object.get(_with_instancetype, ["domain", "devices"], {})

_pref_devices := object.get(_preference, "devices", {})

_features := object.get(_with_instancetype, ["domain", "features"], {})

_pref_features := object.get(_preference, "features", {})

# A preferred value for a field left unset: [path, value] (a null value fills nothing).
_preference_values contains [path, value] if {
	some [path, own] in [
		[["architecture"], ["preferredArchitecture"]],
		[["subdomain"], ["preferredSubdomain"]],
		[["terminationGracePeriodSeconds"], ["preferredTerminationGracePeriodSeconds"]],
		[["domain", "devices", "useVirtioTransitional"], ["devices", "preferredUseVirtioTransitional"]],
		[["domain", "devices", "blockMultiQueue"], ["devices", "preferredBlockMultiQueue"]],
		[["domain", "devices", "networkInterfaceMultiqueue"], ["devices", "preferredNetworkInterfaceMultiQueue"]],
		[["domain", "devices", "rng"], ["devices", "preferredRng"]],
		[["domain", "devices", "tpm"], ["devices", "preferredTPM"]],
		[["domain", "machine", "type"], ["machine", "preferredMachineType"]],
		[["domain", "features", "apic"], ["features", "preferredApic"]],
		[["domain", "features", "kvm"], ["features", "preferredKvm"]],
		[["domain", "features", "pvspinlock"], ["features", "preferredPvspinlock"]],
		[["domain", "features", "smm"], ["features", "preferredSmm"]],
		[["domain", "clock", "timer"], ["clock", "preferredTimer"]],
	]
	object.get(_with_instancetype, path, null) in {null, ""}
	value := object.get(_preference, own, null)
	not value in {null, ""}
}

# ACPI and hotplug: KubeVirt takes the preference's over the VM's.
_preference_values contains [["domain", "features", "acpi"], _pref_features.preferredAcpi] if is_object(_pref_features.preferredAcpi)

_preference_values contains [["domain", "devices", "disableHotplug"], _pref_devices.preferredDisableHotplug] if is_boolean(_pref_devices.preferredDisableHotplug)

_preference_values contains [["domain", "features", "hyperv", name], preferred] if {
	some name, preferred in object.get(_pref_features, "preferredHyperv", {})
	object.get(_features, ["hyperv", name], null) == null
}

_preference_values contains [["domain", "cpu", "features"], array.concat(had, [f |
	some f in _preference.cpu.preferredCPUFeatures
	not f.name in {g.name | some g in had}
])] if {
	count(object.get(_preference, ["cpu", "preferredCPUFeatures"], [])) > 0
	had := object.get(_with_instancetype, ["domain", "cpu", "features"], [])
}

_preference_values contains [["domain", "devices", "sound", "model"], _pref_devices.preferredSoundModel] if {
	object.get(_pref_devices, "preferredSoundModel", "") != ""
	is_object(_devices.sound)
	object.get(_devices.sound, "model", "") == ""
}

_preference_values contains [["domain", "devices", "disks"], [_pref_disk(d) | some d in _devices.disks]] if {
	count(object.get(_devices, "disks", [])) > 0
}

_preference_values contains [["domain", "devices", "interfaces"], [_pref_interface(iface) | some iface in _devices.interfaces]] if {
	count(object.get(_devices, "interfaces", [])) > 0
}

_preference_values contains [["domain", "devices", "inputs"], [object.union(i, _overlay({
	[["bus"], _pref_if_unset(object.get(i, "bus", ""), "preferredInputBus")],
	[["type"], _pref_if_unset(object.get(i, "type", ""), "preferredInputType")],
})) |
	some i in _devices.inputs
]] if {
	count(object.get(_devices, "inputs", [])) > 0
}

_preference_values contains [["domain", "devices", "panicDevices"], [object.union(p, _overlay({[["model"], _pref_devices.preferredPanicDeviceModel]})) | some p in _devices.panicDevices]] if {
	object.get(_pref_devices, "preferredPanicDeviceModel", null) != null
	some device in object.get(_devices, "panicDevices", [])
	object.get(device, "model", null) == null
}

# Disks: a disk of no device type becomes a disk, then gets the preferred bus, block size,
# cache, IO and dedicated IO thread it leaves unset; a CD-ROM and a LUN their preferred bus.
_pref_disk(d) := object.union(d, _overlay({
	[["disk", "bus"], _pref_if_unset(object.get(d, ["disk", "bus"], ""), "preferredDiskBus")],
	[["disk"], _empty_if_absent(object.get(d, "disk", null))],
	[["blockSize"], _null_if_set(object.get(d, "blockSize", null), object.get(_pref_devices, "preferredDiskBlockSize", null))],
	[["cache"], _pref_if_unset(object.get(d, "cache", ""), "preferredDiskCache")],
	[["io"], _pref_if_unset(object.get(d, "io", ""), "preferredDiskIO")],
	[["dedicatedIOThread"], _dedicated_io_thread(d)],
})) if {
	not _other_disk_device(d)
}

_pref_disk(d) := object.union(d, _overlay({[[kind, "bus"], _pref_if_unset(object.get(d, [kind, "bus"], ""), preferred)]})) if {
	not is_object(object.get(d, "disk", null))
	some kind, preferred in {"cdrom": "preferredCdromBus", "lun": "preferredLunBus"}
	is_object(d[kind])
	not _cdrom_and_lun(d, kind)
}

_cdrom_and_lun(d, "lun") if is_object(object.get(d, "cdrom", null))

_other_disk_device(d) if {
	not is_object(object.get(d, "disk", null))
	some kind in ["cdrom", "lun"]
	is_object(d[kind])
}

_empty_if_absent(null) := {}

_empty_if_absent(v) := null if v != null

_dedicated_io_thread(d) := _pref_devices.preferredDiskDedicatedIoThread if {
	object.get(d, "dedicatedIOThread", null) == null
	object.get(_pref_devices, "preferredDiskDedicatedIoThread", null) != null
	_preferred_disk_bus(d) == "virtio"
} else := null

_preferred_disk_bus(d) := b if {
	b := object.get(d, ["disk", "bus"], "")
	b != ""
} else := object.get(_pref_devices, "preferredDiskBus", "")

_pref_if_unset("", preferred) := _non_empty(object.get(_pref_devices, preferred, ""))

_pref_if_unset(value, _) := null if value != ""

_null_if_set(null, preferred) := preferred

_null_if_set(value, _) := null if value != null

# Interfaces: the preferred model, and masquerade for a pod network interface of no binding.
# The default pod interface KubeVirt adds before the preference is applied gets the model too
# (preference_interface_model, read where kubevirt.rego adds it).
_pref_interface(iface) := object.union(iface, _overlay({
	[["model"], _pref_if_unset(object.get(iface, "model", ""), "preferredInterfaceModel")],
	[["masquerade"], _pref_masquerade(iface)],
}))

preference_interface_model := _non_empty(object.get(_pref_devices, "preferredInterfaceModel", ""))

_pref_masquerade(iface) := _pref_devices.preferredInterfaceMasquerade if {
	object.get(_pref_devices, "preferredInterfaceMasquerade", null) != null
	every binding in ["bridge", "masquerade", "sriov", "slirp", "passt", "macvtap", "binding"] {
		object.get(iface, binding, null) == null
	}
	some network in object.get(_with_instancetype, "networks", [])
	network.name == iface.name
	is_object(network.pod)
} else := null

# Firmware: BIOS or EFI only where the VM chose neither bootloader.
_bootloader := object.get(_with_instancetype, ["domain", "firmware", "bootloader"], {})

_pref_firmware := object.get(_preference, "firmware", {})

_no_bootloader if {
	object.get(_bootloader, "bios", null) == null
	object.get(_bootloader, "efi", null) == null
}

_preference_values contains [["domain", "firmware", "bootloader", "bios"], {}] if {
	_no_bootloader
	object.get(_pref_firmware, "preferredUseBios", false) == true
}

_preference_values contains [["domain", "firmware", "bootloader", "bios", "useSerial"], _pref_firmware.preferredUseBiosSerial] if {
	object.get(_pref_firmware, "preferredUseBiosSerial", null) != null
	_bios_after_preference
	object.get(_bootloader, ["bios", "useSerial"], null) == null
}

_bios_after_preference if is_object(_bootloader.bios)

_bios_after_preference if {
	_no_bootloader
	object.get(_pref_firmware, "preferredUseBios", false) == true
}

_preference_values contains [["domain", "firmware", "bootloader", "efi"], _pref_firmware.preferredEfi] if {
	_no_bootloader
	not object.get(_pref_firmware, "preferredUseBios", false) == true
	object.get(_pref_firmware, "preferredEfi", null) != null
}

_preference_values contains [["domain", "firmware", "bootloader", "efi"], _overlay({[["secureBoot"], object.get(_pref_firmware, "preferredUseSecureBoot", null)]})] if {
	_no_bootloader
	not object.get(_pref_firmware, "preferredUseBios", false) == true
	object.get(_pref_firmware, "preferredEfi", null) == null
	object.get(_pref_firmware, "preferredUseEfi", false) == true
}

_preference_values contains [["domain", "firmware", "bootloader", "efi", "secureBoot"], _pref_firmware.preferredUseSecureBoot] if {
	is_object(_bootloader.efi)
	object.get(_bootloader.efi, "secureBoot", null) == null
	object.get(_pref_firmware, "preferredUseSecureBoot", null) != null
}

# Clock: the preferred offset where the VM has neither utc nor timezone.
_preference_values contains [["domain", "clock", key], value] if {
	object.get(_with_instancetype, ["domain", "clock", "utc"], null) == null
	object.get(_with_instancetype, ["domain", "clock", "timezone"], null) == null
	some key, value in object.get(_preference, ["clock", "preferredClockOffset"], {})
}

# What is left to each reference -------------------------------------------------------------

# The values the expansion set where the VM left them unset, as paths: leaves, and the empty
# objects that stand for a device or feature (rng: {}).
_left_to_reference contains path if {
	_spec != _given_spec
	walk(_spec, [path, value])
	_leaf(value)
	object.get(_given_spec, path, null) == null
}

_leaf(value) if {
	not is_object(value)
	not is_array(value)
}

_leaf({})

_left_to(ref) := {_path_text(path) | some path in _left_to_reference; _owner(path) == ref} | _default_interface_left(ref)

_default_interface_left("preference") := {"domain.devices.interfaces[0].model"} if {
	default_pod_interface
	preference_interface_model != null
} else := set()

_default_interface_left("instancetype") := set()

_owner(path) := "instancetype" if {
	_given("instancetype")
	object.get(_instancetype_overlay, path, null) != null
} else := "preference"

_warnings contains {"field": sprintf("spec.%s", [ref]), "message": sprintf("left to %s, which KubeVirt applies when it starts the VM: %s", [_named(ref), concat(", ", sort(_left_to(ref)))])} if {
	some ref in ["instancetype", "preference"]
	_given(ref)
	count(_left_to(ref)) > 0
}

# Fields never written back though the expanded spec leaves them unset: the CPU and memory
# hotplug headroom KubeVirt derives from the instancetype's vCPUs and memory (so that a VM
# moved to another instancetype gets the headroom of the new one), and the model of the
# default pod interface where the preference gives one.
left_to_reference(path) if {
	_given("instancetype")
	path in [["domain", "cpu", "maxSockets"], ["domain", "memory", "maxGuest"]]
}

left_to_reference(["domain", "devices", "interfaces", 0, "model"]) if {
	default_pod_interface
	preference_interface_model != null
}

_path_text(path) := concat("", [_step(i, s) | some i, s in path])

_step(_, s) := sprintf("[%d]", [s]) if is_number(s)

_step(0, s) := s if is_string(s)

_step(i, s) := sprintf(".%s", [s]) if {
	i > 0
	is_string(s)
}

# Helpers ----------------------------------------------------------------------------------------

# The object that has each [path, value] of pairs (null values left out): what to union in.
_overlay(pairs) := object.union_n([_nest(path, value) | some [path, value] in pairs; value != null])

_nest([a], v) := {a: v}

_nest([a, b], v) := {a: {b: v}}

_nest([a, b, c], v) := {a: {b: {c: v}}}

_nest([a, b, c, d], v) := {a: {b: {c: {d: v}}}}

_nest([a, b, c, d, e], v) := {a: {b: {c: {d: {e: v}}}}}

_non_empty(s) := s if s != ""

else := null

_non_empty_list(l) := l if count(l) > 0

else := null
