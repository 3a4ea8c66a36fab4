package virtrules.vm.defaults_test

import data.virtrules.vm.defaults

_machines := ["pc", "q35", "pc-q35-7.2", "pc-i440fx-7.2"]

_vm := {"metadata": {"namespace": "demo", "name": "testvm"}}

_minimal := {
	"domain": {
		"devices": {"interfaces": [{"name": "default", "masquerade": {}}]},
		"memory": {"guest": "64Mi"},
	},
	"networks": [{"name": "default", "pod": {}}],
}

_plan(spec) := p if {
	p := defaults.plan with input as {"object": _vm, "spec": spec, "machines": _machines}
}

test_minimal_vm_plans_a_dummy_ethernet_nic_with_a_derived_mac if {
	p := _plan(_minimal)
	p.errors == []
	p.unsupported == []
	p.domain.memory_kib == 65536

	# KubeVirt's defaults for a live-update cluster: one socket enabled of four.
	p.domain.vcpus == 4
	p.domain.vcpus_current == 1
	p.domain.topology == {"sockets": 4, "cores": 1, "threads": 1}
	p.cpu == {"sockets": 1, "cores": 1, "threads": 1, "max_sockets": 4}
	p.domain.machine == "q35"
	p.domain.cpu_model == "host-model"
	p.architecture == "amd64"
	[nic, _, _, _] := p.domain.interfaces
	nic.source == {"type": "ethernet"}
	nic.alias == "ua-net0"
	nic.model == "virtio-non-transitional"
	nic.rom_disabled
	regex.match(`^02(:[0-9a-f]{2}){5}$`, nic.mac)
	nic.mac == defaults.derived_mac("demo/testvm", "default")
	[x.alias | some x in p.domain.interfaces] == ["ua-net0", "placeholder-0", "placeholder-1", "placeholder-2"]
	p.domain.clock == null
	p.domain.memballoon == "virtio-non-transitional"
	p.domain.memballoon_free_page_reporting == "on"
	p.domain.controllers == [
		{"type": "usb", "index": 0, "model": "none"},
		{"type": "scsi", "index": 0, "model": "virtio-non-transitional"},
		{"type": "virtio-serial", "index": 0, "model": "virtio-non-transitional"},
	]
	p.domain.video == {"model": "vga", "vram": 16384, "heads": 1}
	p.domain.serial_console
	p.domain.channels == ["org.qemu.guest_agent.0"]
	p.max_guest == null
	not p.default_pod_interface
}

test_kubevirt_configuration_changes_the_guest if {
	kv := {"spec": {"configuration": {
		"cpuModel": "Skylake-Server",
		"architectureConfiguration": {"amd64": {"machineType": "pc-q35-rhel9.6.0"}},
		"vmRolloutStrategy": "Stage",
		"virtualMachineOptions": {"disableFreePageReporting": {}},
	}}}
	p := defaults.plan with input as {"object": _vm, "spec": _minimal, "machines": ["pc-q35-rhel9.6.0"], "kubevirt": kv}
	p.errors == []
	p.domain.machine == "pc-q35-rhel9.6.0"
	p.domain.cpu_model == "Skylake-Server"
	p.cpu.max_sockets == 0
	p.domain.vcpus == 1
	p.domain.memballoon_free_page_reporting == "off"

	# The cluster's architecture is arm64: a QEMU given as a list of machines (amd64's) has none.
	arm := defaults.plan with input as {"object": _vm, "spec": _minimal, "machines": _machines, "kubevirt": {"status": {"defaultArchitecture": "arm64"}}}
	[e.field | some e in arm.unsupported] == ["architecture"]
	contains(arm.unsupported[0].message, "qemu-system-arm")
}

_arm_machines := {"amd64": _machines, "arm64": ["virt", "virt-7.2"]}

_arm_plan(spec) := p if {
	p := defaults.plan with input as {"object": _vm, "spec": object.union({"architecture": "arm64"}, spec), "machines": _arm_machines}
}

test_an_arm64_vm_is_planned_as_kubevirts_arm64_mutator_and_converter_build_it if {
	spec := json.patch(_minimal, [
		{"op": "add", "path": "/domain/devices/disks", "value": [{"name": "root", "disk": {}}, {"name": "iso", "cdrom": {"bus": "scsi"}}]},
		{"op": "add", "path": "/volumes", "value": [{"name": "root", "containerDisk": {"image": "x"}}, {"name": "iso", "containerDisk": {"image": "y"}}]},
	])
	p := _arm_plan(spec)
	p.errors == []
	p.unsupported == []
	p.architecture == "arm64"
	p.domain.arch == "aarch64"
	p.domain.machine == "virt"
	p.domain.cpu_model == "host-passthrough"
	p.efi
	[d.bus | some d in p.domain.disks] == ["virtio", "scsi"]
	p.domain.video == {"model": "virtio", "vram": 0, "heads": 1}
	{"type": "usb", "index": 0, "model": "qemu-xhci"} in p.domain.controllers
	p.domain.inputs == [{"alias": "", "type": "tablet", "bus": "usb"}, {"alias": "", "type": "keyboard", "bus": "usb"}]

	# No CPU hotplug on arm64: no maxSockets (KubeVirt's mutator sets none), and none in the
	# domain even where the VM sets one.
	p.cpu.max_sockets == 0
	p.domain.topology == {"sockets": 1, "cores": 1, "threads": 1}
	own := _arm_plan(json.patch(_minimal, [{"op": "add", "path": "/domain/cpu", "value": {"maxSockets": 4}}]))
	own.cpu.max_sockets == 4
	own.domain.topology == {"sockets": 1, "cores": 1, "threads": 1}
	own.domain.vcpus_current == 0
}

test_an_arm64_vm_keeps_its_own_tablet_and_bootloader if {
	spec := json.patch(_minimal, [
		{"op": "add", "path": "/domain/devices/inputs", "value": [{"name": "t", "type": "tablet", "bus": "virtio"}]},
		{"op": "add", "path": "/domain/firmware", "value": {"bootloader": {"efi": {"secureBoot": false}}}},
	])
	p := _arm_plan(spec)
	p.errors == []
	not p.efi
	p.domain.inputs == [{"alias": "ua-input0", "type": "tablet", "bus": "virtio"}, {"alias": "", "type": "keyboard", "bus": "usb"}]
}

test_the_clusters_arm64_machine_type_and_a_qemu_without_it if {
	kv := {"spec": {"configuration": {"architectureConfiguration": {"defaultArchitecture": "arm64", "arm64": {"machineType": "virt-7.2"}}}}}
	p := defaults.plan with input as {"object": _vm, "spec": _minimal, "machines": _arm_machines, "kubevirt": kv}
	p.architecture == "arm64"
	p.domain.machine == "virt-7.2"
	q := defaults.plan with input as {"object": _vm, "spec": _minimal, "machines": {"amd64": _machines, "arm64": ["virt"]}, "kubevirt": kv}
	[e.field | some e in q.errors] == ["domain.machine.type"]
	contains(q.errors[0].message, "for arm64 (supported: virt)")
}

test_what_kubevirt_refuses_on_arm64_is_refused_in_its_words if {
	spec := json.patch(_minimal, [
		{"op": "add", "path": "/domain/firmware", "value": {"bootloader": {"bios": {}}}},
		{"op": "add", "path": "/domain/cpu", "value": {"model": "host-model", "threads": 2, "dedicatedCpuPlacement": true}},
		{"op": "add", "path": "/domain/devices/disks", "value": [{"name": "root", "disk": {"bus": "sata"}}, {"name": "iso", "cdrom": {}}]},
		{"op": "add", "path": "/domain/devices/watchdog", "value": {"name": "w", "i6300esb": {}}},
		{"op": "add", "path": "/domain/devices/sound", "value": {"name": "s"}},
		{"op": "add", "path": "/domain/devices/video", "value": {"type": "vga"}},
		{"op": "add", "path": "/volumes", "value": [{"name": "root", "containerDisk": {"image": "x"}}, {"name": "iso", "containerDisk": {"image": "y"}}]},
	])
	p := _arm_plan(spec)
	got := {e.field | some e in p.errors}
	got == {
		"domain.firmware.bootloader.bios", "domain.cpu.model", "architecture",
		"domain.devices.disks[0].disk.bus", "domain.devices.disks[1].cdrom.bus",
		"domain.devices.watchdog", "domain.devices.sound", "domain.devices.video.type",
	}
	secure := _arm_plan(json.patch(_minimal, [{"op": "add", "path": "/domain/firmware", "value": {"bootloader": {"efi": {}}}}]))
	[e.message | some e in secure.errors] == ["UEFI secure boot is currently not supported on aarch64 Arch"]
}

test_s390x_and_ppc64le_stay_refused if {
	some arch in ["s390x", "ppc64le"]
	p := defaults.plan with input as {"object": _vm, "spec": object.union(_minimal, {"architecture": arch}), "machines": _arm_machines}
	[e.field | some e in p.unsupported] == ["architecture"]
	contains(p.unsupported[0].message, "amd64 and arm64 guests only")
}

test_kubevirt_adds_a_pod_interface_and_disks_for_volumes if {
	spec := {"domain": {"memory": {"guest": "1Gi"}}, "volumes": [{"name": "root", "containerDisk": {"image": "x"}}]}
	p := _plan(spec)
	p.default_pod_interface
	p.pod_interface == {"name": "default", "bridge": {}}
	p.auto_disks == [{"name": "root"}]
	p.domain.disks[0].bus == "sata"
	p.max_guest == "4Gi"
	masquerade := defaults.plan with input as {
		"object": _vm, "spec": spec, "machines": _machines,
		"kubevirt": {"spec": {"configuration": {"network": {"defaultNetworkInterface": "masquerade"}}}},
	}
	masquerade.pod_interface == {"name": "default", "masquerade": {}}
	denied := defaults.plan with input as {
		"object": _vm, "spec": spec, "machines": _machines,
		"kubevirt": {"spec": {"configuration": {"network": {"permitBridgeInterfaceOnPodNetwork": false}}}},
	}
	{e.field | some e in denied.errors} == {"domain.devices.interfaces"}
	off := _plan(json.patch(spec, [{"op": "add", "path": "/domain/devices", "value": {"autoattachPodInterface": false}}]))
	not off.default_pod_interface
	off.domain.interfaces == []
}

test_optional_devices_as_kubevirt_adds_them if {
	spec := json.patch(_minimal, [
		{"op": "add", "path": "/domain/devices/watchdog", "value": {"name": "w"}},
		{"op": "add", "path": "/domain/devices/sound", "value": {"name": "s"}},
		{"op": "add", "path": "/domain/devices/downwardMetrics", "value": {}},
		{"op": "add", "path": "/domain/devices/autoattachGraphicsDevice", "value": false},
		{"op": "add", "path": "/domain/devices/autoattachSerialConsole", "value": false},
		{"op": "add", "path": "/domain/devices/disableHotplug", "value": true},
		{"op": "add", "path": "/domain/devices/useVirtioTransitional", "value": true},
		{"op": "add", "path": "/domain/cpu", "value": {"cores": 2}},
	])
	p := _plan(spec)
	p.domain.watchdog == {"model": "i6300esb", "action": "reset"}
	p.domain.sound == {"model": "ich9"}
	p.domain.channels == ["org.qemu.guest_agent.0", "org.github.vhostmd.1"]
	p.domain.video == null
	not p.domain.serial_console
	p.domain.controllers == [{"type": "usb", "index": 0, "model": "none"}]
	p.domain.interfaces[0].model == "virtio-transitional"

	# cores set, sockets not: KubeVirt writes no topology and adds no CPU hotplug.
	p.cpu == {"max_sockets": 0}
	p.domain.vcpus == 2
}

test_derived_values_are_stable_and_differ_by_identity if {
	defaults.derived_uuid("demo/a") == defaults.derived_uuid("demo/a")
	defaults.derived_uuid("demo/a") != defaults.derived_uuid("demo/b")
	regex.match(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, defaults.derived_uuid("demo/a"))
	defaults.derived_mac("demo/a", "x") != defaults.derived_mac("demo/a", "y")
}

test_user_values_pass_through if {
	spec := json.patch(_minimal, [
		{"op": "add", "path": "/domain/devices/interfaces/0/macAddress", "value": "02:00:00:00:00:01"},
		{"op": "add", "path": "/domain/devices/interfaces/0/model", "value": "virtio"},
		{"op": "add", "path": "/domain/devices/interfaces/0/pciAddress", "value": "0000:00:07.0"},
		{"op": "add", "path": "/domain/firmware", "value": {"uuid": "5d307ca9-b3ef-428c-8861-06e72d69f223"}},
		{"op": "add", "path": "/domain/machine", "value": {"type": "q35"}},
		{"op": "add", "path": "/domain/cpu", "value": {"cores": 2, "model": "Haswell"}},
		{"op": "add", "path": "/domain/clock", "value": {"timezone": "Europe/Berlin"}},
	])
	p := _plan(spec)
	p.errors == []
	p.firmware_uuid == "5d307ca9-b3ef-428c-8861-06e72d69f223"
	p.domain.machine == "q35"
	p.domain.interfaces[0].mac == "02:00:00:00:00:01"
	p.domain.interfaces[0].model == "virtio-non-transitional"
	p.domain.interfaces[0].pci == "0000:00:07.0"
	p.domain.topology == {"sockets": 1, "cores": 2, "threads": 1}
	p.domain.vcpus == 2
	p.cpu == {"max_sockets": 0}
	p.domain.cpu_model == "Haswell"
	p.domain.clock == {"offset": "timezone", "timezone": "Europe/Berlin"}
}

test_utc_clock_and_no_balloon if {
	spec := json.patch(_minimal, [
		{"op": "add", "path": "/domain/clock", "value": {"utc": {}}},
		{"op": "add", "path": "/domain/devices/autoattachMemBalloon", "value": false},
		{"op": "add", "path": "/domain/devices/rng", "value": {}},
		{"op": "add", "path": "/domain/devices/inputs", "value": [{"name": "t", "type": "tablet"}]},
	])
	p := _plan(spec)
	p.domain.clock == {"offset": "utc"}
	p.domain.memballoon == "none"
	p.domain.rng
	p.domain.inputs == [{"alias": "ua-input0", "type": "tablet", "bus": "usb"}]
	p.domain.controllers[0] == {"type": "usb", "index": 0, "model": "qemu-xhci"}
	p.domain.memballoon_free_page_reporting == ""
}

test_memory_and_cpus_from_resources_as_kubevirt_derives_them if {
	spec := json.patch(_minimal, [
		{"op": "remove", "path": "/domain/memory"},
		{"op": "add", "path": "/domain/resources", "value": {"requests": {"memory": "1Gi", "cpu": "1500m"}}},
	])
	p := _plan(spec)
	p.errors == []
	p.domain.memory_kib == 1048576
	p.cpu.sockets == 2
	p.domain.vcpus_current == 2
	p.domain.vcpus == 8
	p.max_guest == "4Gi"
	limits := _plan(json.patch(spec, [{"op": "add", "path": "/domain/resources/limits", "value": {"cpu": "3", "memory": "2Gi"}}]))
	limits.cpu.sockets == 3
	limits.cpu.max_sockets == 12
	wide := _plan(json.patch(spec, [{"op": "add", "path": "/domain/cpu", "value": {"sockets": 2, "cores": 64, "threads": 2}}]))
	wide.cpu.max_sockets == 4
}

test_disks_get_kubevirt_target_names_and_dummy_sources if {
	spec := {
		"domain": {
			"memory": {"guest": "128Mi"},
			"devices": {"disks": [
				{"name": "root", "disk": {}},
				{"name": "data", "disk": {"bus": "sata"}},
				{"name": "cd", "cdrom": {}},
				{"name": "db", "lun": {"bus": "scsi"}},
				{"name": "more"},
				{"name": "pinned", "disk": {"pciAddress": "0000:00:0a.0"}, "bootOrder": 1, "serial": "S1"},
			]},
		},
		"volumes": [
			{"name": "root", "persistentVolumeClaim": {"claimName": "missing"}},
			{"name": "data", "dataVolume": {"name": "dv"}},
			{"name": "cd", "cloudInitNoCloud": {"userData": "#cloud-config"}},
			{"name": "db", "persistentVolumeClaim": {"claimName": "db"}},
			{"name": "more", "containerDisk": {"image": "x"}},
			{"name": "pinned", "emptyDisk": {"capacity": "1Gi"}},
		],
	}
	p := _plan(spec)
	p.errors == []
	[d.dev | some d in p.domain.disks] == ["sda", "sdb", "sdc", "sdd", "sde", "sdf"]
	[d.bus | some d in p.domain.disks] == ["sata", "sata", "sata", "scsi", "sata", "sata"]
	p.domain.disks[2].readonly
	p.domain.disks[3].source == {"type": "block", "path": "/dev/virt-rules-dummy/db"}
	p.domain.disks[0].source == {"type": "file", "path": "/virt-rules-dummy/volumes/root"}
	p.domain.disks[5].pci == "0000:00:0a.0"
	p.domain.disks[5].boot_order == 1
	p.domain.controllers[1] == {"type": "scsi", "index": 0, "model": "virtio-non-transitional"}
	virtio := _plan(json.patch(spec, [{"op": "add", "path": "/domain/devices/disks/0/disk/bus", "value": "virtio"}]))
	virtio.domain.disks[0].dev == "vda"
	virtio.domain.disks[0].model == "virtio-non-transitional"
}

test_a_lun_on_kubevirts_default_bus_is_refused_naming_its_bus if {
	spec := {
		"domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [{"name": "ok", "lun": {"bus": "virtio"}}, {"name": "db", "lun": {}}]}},
		"volumes": [{"name": "ok", "persistentVolumeClaim": {"claimName": "a"}}, {"name": "db", "persistentVolumeClaim": {"claimName": "b"}}],
	}
	[e.field | some e in _plan(spec).errors] == ["domain.devices.disks[1].lun.bus"]
}

test_many_disks_get_two_letter_names if {
	disks := [{"name": sprintf("d%d", [i]), "disk": {"bus": "virtio"}} | some i in numbers.range(0, 27)]
	volumes := [{"name": sprintf("d%d", [i]), "emptyDisk": {}} | some i in numbers.range(0, 27)]
	p := _plan({"domain": {"memory": {"guest": "1Gi"}, "devices": {"disks": disks}}, "volumes": volumes})
	p.domain.disks[25].dev == "vdz"
	p.domain.disks[26].dev == "vdaa"
	p.domain.disks[27].dev == "vdab"
}

test_invalid_fields_are_errors_naming_them if {
	spec := {
		"domain": {
			"machine": {"type": "pc-q35-99"},
			"firmware": {"uuid": "nope"},
			"cpu": {"cores": -1},
			"devices": {
				"disks": [{"name": "ghost", "disk": {"bus": "ide"}}],
				"interfaces": [
					{"name": "nowhere", "macAddress": "01:00:00:00:00:01"},
					{"name": "default", "pciAddress": "1:2:3"},
				],
			},
		},
		"networks": [{"name": "default", "pod": {}}],
	}
	fields := {e.field | some e in _plan(spec).errors}
	fields == {
		"domain.machine.type", "domain.firmware.uuid", "domain.cpu.cores", "domain.memory.guest",
		"domain.devices.disks[0].disk.bus", "domain.devices.disks[0].name",
		"domain.devices.interfaces[0].name", "domain.devices.interfaces[0].macAddress",
		"domain.devices.interfaces[1].pciAddress",
	}
}

test_bad_quantities_and_shapes_are_errors if {
	p := _plan({"domain": {"memory": {"guest": "lots"}, "devices": {"disks": {"name": "x"}}}})
	{e.field | some e in p.errors} == {"domain.memory.guest", "domain.devices.disks"}
	not_object := defaults.plan with input as {"object": _vm, "spec": "x", "machines": _machines}
	"spec" in {e.field | some e in not_object.errors}
	bad_pci := _plan({
		"domain": {"memory": {"guest": "1Gi"}, "devices": {"disks": [{"name": "v", "disk": {"pciAddress": "zz"}}]}},
		"volumes": [{"name": "v", "emptyDisk": {}}],
	})
	{e.field | some e in bad_pci.errors} == {"domain.devices.disks[0].disk.pciAddress"}
}

test_unknown_sources_are_unsupported if {
	spec := {
		"domain": {
			"memory": {"guest": "1Gi"},
			"devices": {"interfaces": [{"name": "n", "bridge": {}}], "disks": [{"name": "odd", "disk": {}}]},
		},
		"networks": [{"name": "n", "magic": {}}],
		"volumes": [{"name": "odd", "someNewSource": {}}],
	}
	p := _plan(spec)
	{e.field | some e in p.unsupported} == {"networks[0]", "volumes[0]"}
	p.warnings == []
}

test_host_devices_are_left_to_the_node_with_a_warning_each if {
	spec := {
		"domain": {
			"memory": {"guest": "1Gi"},
			"devices": {
				"interfaces": [
					{"name": "default", "masquerade": {}},
					{"name": "vf", "sriov": {}},
					{"name": "pinned", "sriov": {}, "pciAddress": "0000:09:00.0", "macAddress": "02:00:00:00:00:09"},
				],
				"gpus": [{"name": "g", "deviceName": "nvidia.com/x"}],
				"hostDevices": [{"name": "h", "deviceName": "kubevirt.io/storage"}],
			},
		},
		"networks": [
			{"name": "default", "pod": {}},
			{"name": "vf", "multus": {"networkName": "sriov"}},
			{"name": "pinned", "multus": {"networkName": "sriov"}},
		],
	}
	p := _plan(spec)
	p.errors == []
	p.unsupported == []
	[e.field | some e in p.warnings] == [
		"domain.devices.gpus[0]",
		"domain.devices.hostDevices[0]",
		"domain.devices.interfaces[1].macAddress",
		"domain.devices.interfaces[1].pciAddress",
	]

	# The VFs are not defined: the pod NIC and one placeholder (4 NICs in all, VFs counted).
	[x.alias | some x in p.domain.interfaces] == ["ua-net0", "placeholder-0"]
}

test_an_unnamed_object_is_identified_by_its_generate_name_and_spec if {
	a := defaults.identity with input as {"object": {"metadata": {"namespace": "n", "generateName": "vm-"}}, "spec": _minimal}
	startswith(a, "n/vm-")
	b := defaults.identity with input as {"object": {"metadata": {"namespace": "n", "generateName": "vm-"}}, "spec": {}}
	a != b
	c := defaults.identity with input as {"object": {"metadata": {"namespace": "n", "generateName": "vm-"}}, "spec": _minimal, "request": "uid-1"}
	c == "n/vm-uid-1"
	named := defaults.identity with input as {"object": _vm, "spec": _minimal, "request": "uid-1"}
	named == "demo/testvm"
	in_cluster := defaults.identity with input as {"object": _vm, "spec": _minimal, "namespace_uid": "6f1c"}
	in_cluster == "uid:6f1c/testvm"
}

test_memory_beyond_64_bits_is_refused_naming_the_field if {
	p := _plan({"domain": {"memory": {"guest": "999999Ei"}}})
	[e.field | some e in p.errors] == ["domain.memory.guest"]
	p.domain.memory_kib == 0
	contains(p.errors[0].message, "at most 8Ei")
}

test_more_vcpus_than_any_guest_can_have_is_an_error_naming_the_cpu if {
	huge := json.patch(_minimal, [{"op": "add", "path": "/domain/cpu", "value": {"sockets": 4000, "cores": 4000, "threads": 4000}}])
	[e] := _plan(huge).errors
	e.field == "domain.cpu"
	contains(e.message, "64000000000 vCPUs")
	contains(e.message, "at most 4096")

	# the hotplug headroom counts: 64 sockets of 8 vCPUs, a cluster maxCpuSockets of 1024
	headroom := json.patch(_minimal, [{"op": "add", "path": "/domain/cpu", "value": {"sockets": 64, "maxSockets": 1024, "cores": 8}}])
	[h] := _plan(headroom).errors
	h.message == "8192 vCPUs (1024 sockets, maxSockets with the CPU hotplug headroom, x 8 cores x 1 threads) is more than any guest can have (at most 4096)"

	# at the limit, no error
	at_limit := json.patch(_minimal, [{"op": "add", "path": "/domain/cpu", "value": {"sockets": 1024, "maxSockets": 1024, "cores": 4}}])
	_plan(at_limit).errors == []
}

test_an_address_behind_a_pcie_to_pci_bridge_plans_the_bridge if {
	spec := json.patch(_minimal, [{"op": "add", "path": "/domain/devices/interfaces/0/pciAddress", "value": "0000:02:01.0"}])
	p := _plan(spec)
	{"type": "pci", "index": 2, "model": "pcie-to-pci-bridge"} in p.domain.controllers

	# A root port's slot 0 plans nothing more.
	q := _plan(json.patch(_minimal, [{"op": "add", "path": "/domain/devices/interfaces/0/pciAddress", "value": "0000:0a:00.0"}]))
	every c in q.domain.controllers {
		c.type != "pci"
	}
}

test_a_virtio_cdrom_is_refused_on_every_architecture if {
	# KubeVirt's disk admitter refuses it: the bus the VM names, in its words, no arm64 hint.
	spec := json.patch(_minimal, [
		{"op": "add", "path": "/domain/devices/disks", "value": [{"name": "iso", "cdrom": {"bus": "virtio"}}]},
		{"op": "add", "path": "/volumes", "value": [{"name": "iso", "containerDisk": {"image": "x"}}]},
	])
	p := _plan(spec)
	p.errors == [{"field": "domain.devices.disks[0].cdrom.bus", "message": "Bus type virtio is invalid for CD-ROM device"}]
}
