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
	p.domain.vcpus == 1
	p.domain.topology == {"sockets": 1, "cores": 1, "threads": 1}
	p.domain.machine == ""
	[nic] := p.domain.interfaces
	nic.source == {"type": "ethernet"}
	nic.alias == "ua-net0"
	regex.match(`^02(:[0-9a-f]{2}){5}$`, nic.mac)
	nic.mac == defaults.derived_mac("demo/testvm", "default")
	p.domain.clock == null
	p.domain.memballoon == ""
	p.domain.controllers == []
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
	p.domain.interfaces[0].model == "virtio"
	p.domain.interfaces[0].pci == "0000:00:07.0"
	p.domain.topology == {"sockets": 1, "cores": 2, "threads": 1}
	p.domain.vcpus == 2
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
	p.domain.inputs == [{"alias": "ua-input0", "type": "tablet", "bus": ""}]
}

test_memory_and_cpus_from_resources_as_kubevirt_derives_them if {
	spec := json.patch(_minimal, [
		{"op": "remove", "path": "/domain/memory"},
		{"op": "add", "path": "/domain/resources", "value": {"requests": {"memory": "1Gi", "cpu": "1500m"}}},
	])
	p := _plan(spec)
	p.errors == []
	p.domain.memory_kib == 1048576
	p.domain.topology.sockets == 2
	p.domain.vcpus == 2
	limits := _plan(json.patch(spec, [{"op": "add", "path": "/domain/resources/limits", "value": {"cpu": "3", "memory": "2Gi"}}]))
	limits.domain.topology.sockets == 3
}

test_disks_get_kubevirt_target_names_and_dummy_sources if {
	spec := {
		"domain": {
			"memory": {"guest": "128Mi"},
			"devices": {"disks": [
				{"name": "root", "disk": {}},
				{"name": "data", "disk": {"bus": "sata"}},
				{"name": "cd", "cdrom": {}},
				{"name": "db", "lun": {}},
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
	[d.dev | some d in p.domain.disks] == ["vda", "sda", "sdb", "sdc", "vdb", "vdc"]
	[d.bus | some d in p.domain.disks] == ["virtio", "sata", "sata", "scsi", "virtio", "virtio"]
	p.domain.disks[2].readonly
	p.domain.disks[3].source == {"type": "block", "path": "/dev/virt-rules-dummy/db"}
	p.domain.disks[0].source == {"type": "file", "path": "/virt-rules-dummy/volumes/root"}
	p.domain.disks[5].pci == "0000:00:0a.0"
	p.domain.disks[5].boot_order == 1
	p.domain.controllers == [{"type": "scsi", "index": 0, "model": "virtio-scsi"}]
}

test_many_disks_get_two_letter_names if {
	disks := [{"name": sprintf("d%d", [i]), "disk": {}} | some i in numbers.range(0, 27)]
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

test_passthrough_and_unknown_sources_are_unsupported if {
	spec := {
		"domain": {
			"memory": {"guest": "1Gi"},
			"devices": {"interfaces": [{"name": "vf", "sriov": {}}], "disks": [{"name": "odd", "disk": {}}]},
		},
		"networks": [{"name": "vf", "magic": {}}],
		"volumes": [{"name": "odd", "someNewSource": {}}],
	}
	p := _plan(spec)
	{e.field | some e in p.unsupported} == {"domain.devices.interfaces[0].sriov", "networks[0]", "volumes[0]"}
	p.domain.interfaces == []
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
}
