package virtrules.vm.defaults_test

import data.virtrules.vm.defaults

# A VM of KubeVirt's examples/ shape: two disks, the default pod interface left to KubeVirt.
_it_vm(refs) := {"kind": "VirtualMachine", "metadata": {"namespace": "demo", "name": "it"}, "spec": refs}

_it_spec := {
	"domain": {"devices": {"disks": [
		{"name": "root", "disk": {}},
		{"name": "cloudinit"},
		{"name": "iso", "cdrom": {}},
	]}},
	"volumes": [
		{"name": "root", "containerDisk": {"image": "fedora"}},
		{"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}},
		{"name": "iso", "persistentVolumeClaim": {"claimName": "iso"}},
	],
}

_u1_medium := {"kind": "VirtualMachineClusterInstancetype", "name": "u1.medium", "revision": "", "spec": {"cpu": {"guest": 1}, "memory": {"guest": "4Gi"}}}

_fedora := {"kind": "VirtualMachineClusterPreference", "name": "fedora", "revision": "", "spec": {
	"devices": {"preferredDiskBus": "virtio", "preferredInterfaceModel": "virtio", "preferredRng": {}, "preferredCdromBus": "sata"},
	"features": {"preferredSmm": {}},
	"firmware": {"preferredEfi": {"secureBoot": true}},
	"preferredArchitecture": "amd64",
}}

_it_plan(refs, given, spec) := p if {
	p := defaults.plan with input as object.union({"object": _it_vm(refs), "spec": spec, "machines": _machines}, given)
}

_both := {"instancetype": {"name": "u1.medium"}, "preference": {"name": "fedora"}}

test_instancetype_and_preference_expand_before_the_guest_is_planned if {
	p := _it_plan(_both, {"instancetype": _u1_medium, "preference": _fedora}, _it_spec)
	p.errors == []
	p.unsupported == []
	p.domain.memory_kib == 4194304
	p.domain.vcpus_current == 1
	p.architecture == "amd64"

	# The preference's buses where the VM has none, a disk for a disk of no device type.
	[d.bus | some d in p.domain.disks] == ["virtio", "virtio", "sata"]
	p.domain.rng == true

	# The default pod interface KubeVirt adds gets the preference's model.
	p.pod_interface.model == "virtio"
}

test_what_is_left_to_each_reference_is_named if {
	p := _it_plan(_both, {"instancetype": _u1_medium, "preference": _fedora}, _it_spec)
	warnings := {w.field: w.message | some w in p.warnings}
	contains(warnings["spec.instancetype"], "VirtualMachineClusterInstancetype u1.medium")
	contains(warnings["spec.instancetype"], "domain.cpu.sockets")
	contains(warnings["spec.instancetype"], "domain.memory.guest")
	contains(warnings["spec.preference"], "domain.devices.disks[0].disk.bus")
	contains(warnings["spec.preference"], "domain.devices.interfaces[0].model")
	contains(warnings["spec.preference"], "domain.firmware.bootloader.efi.secureBoot")
	contains(warnings["spec.preference"], "domain.devices.rng")
	not contains(warnings["spec.preference"], "domain.memory.guest")
}

test_a_pinned_revision_is_named if {
	pinned := object.union(_u1_medium, {"revision": "vm-u1.medium-1"})
	p := _it_plan({"instancetype": {"name": "u1.medium"}}, {"instancetype": pinned}, _it_spec)
	some w in p.warnings
	contains(w.message, "u1.medium (revision vm-u1.medium-1)")
}

test_a_vm_setting_what_its_instancetype_sets_is_refused if {
	spec := json.patch(_it_spec, [
		{"op": "add", "path": "/domain/memory", "value": {"guest": "128Mi"}},
		{"op": "add", "path": "/domain/cpu", "value": {"sockets": 2, "model": "Haswell"}},
		{"op": "add", "path": "/domain/resources", "value": {"requests": {"cpu": "2"}}},
	])
	it := object.union(_u1_medium, {"spec": {"cpu": {"model": "Skylake"}, "nodeSelector": {"a": "b"}}})
	p := _it_plan({"instancetype": {"name": "u1.medium"}}, {"instancetype": it}, spec)
	{e.field | some e in p.errors} == {"domain.memory.guest", "domain.cpu.sockets", "domain.cpu.model", "domain.resources.requests.cpu"}
	some e in p.errors
	contains(e.message, "a conflict")

	# A model the instancetype leaves alone is the VM's to set.
	q := _it_plan({"instancetype": {"name": "u1.medium"}}, {"instancetype": _u1_medium}, json.patch(_it_spec, [{"op": "add", "path": "/domain/cpu", "value": {"model": "Haswell"}}]))
	q.errors == []
	q.domain.cpu_model == "Haswell"
}

test_a_reference_not_given_or_inferred_is_named if {
	p := _it_plan(_both, {}, _it_spec)
	{e.field | some e in p.errors} == {"spec.instancetype.name", "spec.preference.name", "domain.memory.guest"}
	some e in p.errors
	contains(e.message, "VirtualMachineClusterInstancetype \"u1.medium\" was not given")
	inferred := _it_plan({"instancetype": {"inferFromVolume": "root"}}, {}, _it_spec)
	{e.field | some e in inferred.unsupported} == {"spec.instancetype.inferFromVolume"}
	namespaced := _it_plan({"preference": {"name": "p", "kind": "VirtualMachinePreference"}}, {}, _it_spec)
	some n in namespaced.errors
	startswith(n.message, "VirtualMachinePreference \"p\"")
}

test_a_vmi_has_no_references if {
	p := defaults.plan with input as {"object": {"kind": "VirtualMachineInstance", "metadata": {"name": "x"}, "spec": {"instancetype": {"name": "ignored"}}}, "spec": json.patch(_it_spec, [{"op": "add", "path": "/domain/memory", "value": {"guest": "1Gi"}}]), "machines": _machines}
	p.errors == []
}

_topology(t, extra) := topology if {
	four := object.union(_u1_medium, {"spec": {"cpu": {"guest": 4}}})
	pref := {"kind": "VirtualMachinePreference", "name": "p", "spec": object.union({"cpu": {"preferredCPUTopology": t}}, extra)}
	topology := defaults.topology with input as {
		"object": _it_vm({"instancetype": {"name": "u1.medium"}, "preference": {"name": "p"}}),
		"spec": _it_spec, "machines": _machines, "instancetype": four, "preference": pref,
	}
}

test_the_preferred_topology_lays_out_the_vcpus if {
	object.subset(_topology("sockets", {}), {"sockets": 4, "cores": 1, "threads": 1})
	object.subset(_topology("preferCores", {}), {"sockets": 1, "cores": 4, "threads": 1})
	object.subset(_topology("threads", {}), {"sockets": 1, "cores": 1, "threads": 4})
	object.subset(_topology("spread", {}), {"sockets": 2, "cores": 2, "threads": 1})
	object.subset(_topology("spread", {"cpu": {"spreadOptions": {"across": "CoresThreads"}}}), {"sockets": 1, "cores": 2, "threads": 2})
	object.subset(_topology("spread", {"cpu": {"spreadOptions": {"across": "SocketsCoresThreads", "ratio": 2}}}), {"sockets": 1, "cores": 2, "threads": 2})
	object.subset(_topology("spread", {"preferSpreadSocketToCoreRatio": 4}), {"sockets": 1, "cores": 4, "threads": 1})
}

test_a_spread_the_vcpus_do_not_divide_is_refused if {
	three := object.union(_u1_medium, {"spec": {"cpu": {"guest": 3}}})
	pref := {"kind": "VirtualMachinePreference", "name": "p", "spec": {"cpu": {"preferredCPUTopology": "spread", "spreadOptions": {"across": "SocketsCoresThreads"}}}}
	p := _it_plan({"instancetype": {"name": "u1.medium"}, "preference": {"name": "p"}}, {"instancetype": three, "preference": pref}, _it_spec)
	some e in p.errors
	e.field == "spec.instancetype"
	contains(e.message, "cannot lay out")
	pairs := object.union(pref, {"spec": {"cpu": {"spreadOptions": {"across": "CoresThreads"}}}})
	q := _it_plan({"instancetype": {"name": "u1.medium"}, "preference": {"name": "p"}}, {"instancetype": three, "preference": pairs}, _it_spec)
	some f in q.errors
	f.field == "spec.instancetype"
}

test_the_instancetype_owns_what_it_sets if {
	big := {"kind": "VirtualMachineInstancetype", "name": "big", "spec": {
		"cpu": {"guest": 2, "dedicatedCPUPlacement": true, "maxSockets": 8},
		"memory": {"guest": "2Gi", "overcommitPercent": 50, "hugepages": {"pageSize": "2Mi"}},
		"schedulerName": "custom", "ioThreadsPolicy": "auto", "ioThreads": {"supplementalPoolThreadCount": 2},
		"gpus": [{"name": "g", "deviceName": "nvidia.com/x"}],
	}}
	p := _it_plan({"instancetype": {"name": "big", "kind": "VirtualMachineInstancetype"}}, {"instancetype": big}, _it_spec)
	p.errors == []
	p.domain.vcpus == 8
	some w in p.warnings
	w.field == "domain.devices.gpus[0]"
	some o in p.warnings
	o.field == "spec.instancetype"
	contains(o.message, "domain.resources.requests.memory")
	contains(o.message, "domain.schedulerName") == false
	contains(o.message, "schedulerName")
	d := defaults.defaults with input as {"object": _it_vm({"instancetype": {"name": "big"}}), "spec": _it_spec, "instancetype": big, "plan": p, "domain": {}}
	{def.path[1] | some def in d} & {"cpu", "memory", "resources"} == set()
	count(d) > 0
	conflicted := _it_plan({"instancetype": {"name": "big"}}, {"instancetype": big}, json.patch(_it_spec, [
		{"op": "add", "path": "/schedulerName", "value": "mine"},
		{"op": "add", "path": "/domain/ioThreadsPolicy", "value": "shared"},
		{"op": "add", "path": "/domain/cpu", "value": {"dedicatedCpuPlacement": true}},
	]))
	{e.field | some e in conflicted.errors} == {"schedulerName", "domain.ioThreadsPolicy", "domain.cpu.dedicatedCpuPlacement"}
}

test_the_preference_fills_only_what_the_vm_leaves_unset if {
	pref := {"kind": "VirtualMachinePreference", "name": "p", "spec": {
		"devices": {
			"preferredDiskBus": "scsi", "preferredDiskCache": "none", "preferredDiskIO": "native",
			"preferredDiskDedicatedIoThread": true, "preferredDiskBlockSize": {"custom": {"logical": 512, "physical": 512}},
			"preferredLunBus": "scsi", "preferredInputBus": "virtio", "preferredInputType": "tablet",
			"preferredSoundModel": "ac97", "preferredUseVirtioTransitional": true, "preferredDisableHotplug": true,
			"preferredAutoattachMemBalloon": false, "preferredInterfaceMasquerade": {}, "preferredPanicDeviceModel": "isa",
			"preferredTPM": {},
		},
		"cpu": {"preferredCPUFeatures": [{"name": "vmx", "policy": "require"}, {"name": "pcid"}]},
		"features": {"preferredAcpi": {"enabled": true}, "preferredApic": {}, "preferredHyperv": {"relaxed": {}, "vapic": {}}, "preferredKvm": {"hidden": true}},
		"clock": {"preferredClockOffset": {"utc": {}}, "preferredTimer": {"hpet": {"present": false}}},
		"machine": {"preferredMachineType": "pc-q35-7.2"},
		"preferredSubdomain": "sub", "preferredTerminationGracePeriodSeconds": 30,
	}}
	spec := {
		"domain": {
			"cpu": {"features": [{"name": "pcid", "policy": "disable"}]},
			"memory": {"guest": "1Gi"},
			"features": {"acpi": {"enabled": false}, "hyperv": {"relaxed": {"enabled": false}}},
			"devices": {
				"disks": [{"name": "a"}, {"name": "b", "disk": {"bus": "sata"}}, {"name": "l", "lun": {}}],
				"inputs": [{"name": "i"}, {"name": "j", "bus": "usb", "type": "tablet"}],
				"sound": {"name": "s"},
				"panicDevices": [{}],
				"interfaces": [{"name": "pod"}, {"name": "m", "bridge": {}}],
			},
		},
		"networks": [{"name": "pod", "pod": {}}, {"name": "m", "multus": {"networkName": "x"}}],
		"volumes": [
			{"name": "a", "containerDisk": {"image": "x"}}, {"name": "b", "emptyDisk": {"capacity": "1Gi"}},
			{"name": "l", "persistentVolumeClaim": {"claimName": "l"}},
		],
	}
	p := _it_plan({"preference": {"name": "p", "kind": "VirtualMachinePreference"}}, {"preference": pref}, spec)
	p.errors == []
	p.domain.machine == "pc-q35-7.2"
	p.domain.sound.model == "ac97"
	p.domain.memballoon == "none"
	[d.bus | some d in p.domain.disks] == ["scsi", "sata", "scsi"]
	[i.bus | some i in p.domain.inputs] == ["virtio", "usb"]
	p.domain.clock.offset == "utc"
	some w in p.warnings
	w.field == "spec.preference"
	every field in [
		"domain.cpu.features", "domain.devices.disks[0].cache", "domain.devices.disks[0].io",
		"domain.devices.disks[0].blockSize.custom.logical", "domain.devices.disks[2].lun.bus",
		"domain.devices.interfaces[0].masquerade", "domain.devices.panicDevices[0].model",
		"domain.features.apic", "domain.features.hyperv.vapic", "domain.features.kvm.hidden",
		"domain.clock.timer.hpet.present", "domain.devices.useVirtioTransitional", "domain.devices.tpm",
		"subdomain", "terminationGracePeriodSeconds", "domain.devices.disableHotplug",
	] {
		contains(w.message, field)
	}
	not contains(w.message, "dedicatedIOThread") # a SCSI disk gets no dedicated IO thread
	not contains(w.message, "domain.devices.interfaces[1].masquerade")
	not contains(w.message, "domain.features.hyperv.relaxed")
}

_left(firmware, spec) := concat(" ", [w.message | some w in p.warnings]) if {
	pref := {"kind": "VirtualMachinePreference", "name": "p", "spec": {"firmware": firmware}}
	p := _it_plan({"preference": {"name": "p", "kind": "VirtualMachinePreference"}}, {"preference": pref}, spec)
}

test_firmware_preferences_as_kubevirt_takes_them if {
	contains(_left({"preferredUseBios": true, "preferredUseBiosSerial": true}, _it_spec), "domain.firmware.bootloader.bios.useSerial")
	contains(_left({"preferredUseEfi": true, "preferredUseSecureBoot": false}, _it_spec), "domain.firmware.bootloader.efi.secureBoot")
	bios := json.patch(_it_spec, [{"op": "add", "path": "/domain/firmware", "value": {"bootloader": {"bios": {}}}}])
	contains(_left({"preferredUseBiosSerial": true, "preferredEfi": {}}, bios), "domain.firmware.bootloader.bios.useSerial")
	not contains(_left({"preferredEfi": {}}, bios), "efi")
	efi := json.patch(_it_spec, [{"op": "add", "path": "/domain/firmware", "value": {"bootloader": {"efi": {}}}}])
	contains(_left({"preferredUseSecureBoot": true}, efi), "domain.firmware.bootloader.efi.secureBoot")
}

test_defaults_leave_what_the_references_give_to_them if {
	given := {"instancetype": _u1_medium, "preference": _fedora}
	p := _it_plan(_both, given, _it_spec)
	domain := {"devices": [{"disk": [
		{"alias": [{"@name": "ua-disk0"}], "target": [{"@bus": "virtio"}], "address": [{"@type": "pci", "@domain": "0x0000", "@bus": "0x07", "@slot": "0x00", "@function": "0x0"}]},
		{"alias": [{"@name": "ua-disk1"}], "target": [{"@bus": "virtio"}], "address": [{"@type": "pci", "@domain": "0x0000", "@bus": "0x08", "@slot": "0x00", "@function": "0x0"}]},
	]}]}
	d := defaults.defaults with input as object.union({"object": _it_vm(_both), "spec": _it_spec, "plan": p, "domain": domain}, given)
	paths := {concat(".", [sprintf("%v", [s]) | some s in def.path]) | some def in d}
	"domain.devices.disks.0.disk.pciAddress" in paths
	not "domain.devices.disks.0.disk.bus" in paths
	not "domain.cpu.sockets" in paths
	not "domain.cpu.maxSockets" in paths
	not "domain.memory.guest" in paths
	not "domain.memory.maxGuest" in paths
	not "domain.devices.interfaces.0.model" in paths
	not "architecture" in paths
	"domain.devices.interfaces.0.name" in paths
	"domain.firmware.uuid" in paths
}
