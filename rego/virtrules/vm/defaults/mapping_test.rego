package virtrules.vm.defaults_test

import data.virtrules.vm.defaults

# What libvirt 9.0 returns for the minimal VM on i440fx (trimmed to what the rules read).
_domain := {
	"@type": "qemu",
	"name": [{"#text": "virt-rules-1234-1"}],
	"uuid": [{"#text": "0b7e4b14-6f53-4b9a-9f6f-1c6a0c5c6b43"}],
	"memory": [{"@unit": "KiB", "#text": "65536"}],
	"vcpu": [{"@placement": "static", "#text": "1"}],
	"os": [{"type": [{"@arch": "x86_64", "@machine": "pc-i440fx-7.2", "#text": "hvm"}]}],
	"cpu": [{"@mode": "custom", "model": [{"#text": "qemu64"}], "topology": [{"@sockets": "1", "@dies": "1", "@cores": "1", "@threads": "1"}]}],
	"clock": [{"@offset": "utc"}],
	"devices": [{
		"emulator": [{"#text": "/usr/bin/qemu-system-x86_64"}],
		"disk": [
			{
				"@device": "cdrom",
				"driver": [{"@name": "qemu", "@type": "raw"}],
				"source": [{"@file": "/virt-rules-dummy/volumes/cd"}],
				"target": [{"@dev": "sda", "@bus": "sata"}],
				"readonly": [{}],
				"alias": [{"@name": "ua-disk1"}],
				"address": [{"@type": "drive", "@controller": "0", "@bus": "0", "@target": "0", "@unit": "0"}],
			},
			{
				"@device": "disk",
				"source": [{"@file": "/virt-rules-dummy/volumes/root"}],
				"target": [{"@dev": "vda", "@bus": "virtio"}],
				"alias": [{"@name": "ua-disk0"}],
				"address": [{"@type": "pci", "@domain": "0x0000", "@bus": "0x00", "@slot": "0x05", "@function": "0x0"}],
			},
		],
		"interface": [{
			"@type": "ethernet",
			"mac": [{"@address": "02:6f:fa:19:34:6a"}],
			"model": [{"@type": "rtl8139"}],
			"alias": [{"@name": "ua-net0"}],
			"address": [{"@type": "pci", "@domain": "0x0000", "@bus": "0x00", "@slot": "0x02", "@function": "0x0"}],
		}],
		"input": [{"@type": "tablet", "@bus": "usb", "alias": [{"@name": "ua-input0"}]}, {"@type": "mouse", "@bus": "ps2"}],
		"audio": [{"@id": "1", "@type": "none"}],
		"memballoon": [{"@model": "virtio"}],
	}],
}

_spec := {
	"domain": {
		"devices": {
			"disks": [{"name": "root"}, {"name": "cd", "cdrom": {}}],
			"interfaces": [{"name": "default", "masquerade": {}}],
			"inputs": [{"name": "t", "type": "tablet"}],
		},
		"memory": {"guest": "64Mi"},
	},
	"networks": [{"name": "default", "pod": {}}],
	"volumes": [{"name": "root", "dataVolume": {"name": "x"}}, {"name": "cd", "containerDisk": {"image": "x"}}],
}

_defaults(spec) := result if {
	p := defaults.plan with input as {"object": {"metadata": {"namespace": "demo", "name": "testvm"}}, "spec": spec, "machines": ["pc"]}
	result := {concat(".", [sprintf("%v", [s]) | some s in d.path]): d.value |
		some d in defaults.defaults with input as {"spec": spec, "plan": p, "domain": _domain}
	}
}

test_guest_visible_values_map_to_unset_fields if {
	d := _defaults(_spec)
	d == {
		# KubeVirt's choices, not libvirt's expansion: the machine type and architecture the
		# mutating webhook sets, the topology and hotplug headroom it derives.
		"architecture": "amd64",
		"domain.machine.type": "q35",
		"domain.cpu.sockets": 1, "domain.cpu.cores": 1, "domain.cpu.threads": 1, "domain.cpu.maxSockets": 4,
		"domain.cpu.model": "qemu64",
		"domain.firmware.uuid": defaults.derived_uuid("demo/testvm"),
		"domain.devices.autoattachMemBalloon": true,
		"domain.devices.disks.0.disk.bus": "virtio",
		"domain.devices.disks.0.disk.pciAddress": "0000:00:05.0",
		"domain.devices.disks.1.cdrom.bus": "sata",
		"domain.devices.disks.1.cdrom.readonly": true,
		"domain.devices.interfaces.0.macAddress": "02:6f:fa:19:34:6a",
		"domain.devices.interfaces.0.model": "rtl8139",
		"domain.devices.interfaces.0.pciAddress": "0000:00:02.0",
		"domain.devices.inputs.0.bus": "usb",
	}
}

test_kubevirt_names_and_additions if {
	dom := json.patch(_domain, [{"op": "replace", "path": "/devices/0/interface/0/model/0/@type", "value": "virtio-non-transitional"}])
	spec := {"domain": {"memory": {"guest": "1Gi"}}, "volumes": [{"name": "root", "containerDisk": {"image": "x"}}]}
	p := defaults.plan with input as {"object": {"metadata": {"namespace": "demo", "name": "testvm"}}, "spec": spec, "machines": ["q35"]}
	d := {concat(".", [sprintf("%v", [s]) | some s in x.path]): x.value | some x in defaults.defaults with input as {"spec": spec, "plan": p, "domain": dom}}
	d["domain.devices.interfaces.0.model"] == "virtio"
	d["domain.devices.interfaces.0.name"] == "default"
	d["domain.devices.interfaces.0.bridge"] == {}
	d["networks.0.name"] == "default"
	d["networks.0.pod"] == {}
	d["domain.devices.disks.0.name"] == "root"
	d["domain.memory.maxGuest"] == "4Gi"
}

test_set_fields_are_never_defaulted if {
	spec := json.patch(_spec, [
		{"op": "add", "path": "/domain/machine", "value": {"type": "pc"}},
		{"op": "add", "path": "/domain/clock", "value": {"timezone": "UTC"}},
		{"op": "add", "path": "/domain/devices/interfaces/0/model", "value": "e1000"},
	])
	d := _defaults(spec)
	not d["domain.machine.type"]
	not d["domain.clock.utc"]
	not d["domain.devices.interfaces.0.model"]
	d["domain.devices.interfaces.0.macAddress"] == "02:6f:fa:19:34:6a"
}

test_backend_only_values_are_not_visible if {
	gv := defaults.guest_visible with input as {"domain": _domain}
	not gv.name
	not gv.uuid
	not gv.devices[0].emulator
	not gv.devices[0].audio
	every d in gv.devices[0].disk {
		not d.source
		not d.driver
		not d.alias
	}
	gv.devices[0].interface[0].model == [{"@type": "rtl8139"}]
}

test_memory_host_model_and_odd_sizes if {
	dom := json.patch(_domain, [
		{"op": "replace", "path": "/memory/0/#text", "value": "1536"},
		{"op": "replace", "path": "/cpu/0", "value": {"@mode": "host-model"}},
	])
	spec := json.patch(_spec, [{"op": "remove", "path": "/domain/memory"}])
	p := defaults.plan with input as {"object": {"metadata": {"name": "a"}}, "spec": spec, "machines": ["pc"]}
	d := {concat(".", [sprintf("%v", [s]) | some s in x.path]): x.value | some x in defaults.defaults with input as {"spec": spec, "plan": p, "domain": dom}}
	d["domain.memory.guest"] == "1536Ki"
	d["domain.cpu.model"] == "host-model"
}

test_formats if {
	defaults.kib_quantity(2097152) == "2Gi"
	defaults.kib_quantity(1536) == "1536Ki"
	defaults.kib_quantity(2048) == "2Mi"
	defaults.pci_address({"@type": "pci", "@domain": "0x0000", "@bus": "0x1", "@slot": "0x1f", "@function": "0x7"}) == "0000:01:1f.7"
	not defaults.pci_address({"@type": "drive"})
}

test_an_arm64_vm_gets_kubevirts_arm64_bootloader if {
	# An arm64 CD-ROM names its bus (KubeVirt's arm64 default for it, virtio, is refused).
	spec := json.patch(object.union(_spec, {"architecture": "arm64"}), [{"op": "replace", "path": "/domain/devices/disks/1/cdrom", "value": {"bus": "scsi"}}])
	p := defaults.plan with input as {"object": {"metadata": {"name": "a"}}, "spec": spec, "machines": {"arm64": ["virt"]}}
	d := {concat(".", [sprintf("%v", [s]) | some s in x.path]): x.value | some x in defaults.defaults with input as {"spec": spec, "plan": p, "domain": _domain}}
	not d.architecture # the VM's own
	d["domain.machine.type"] == "virt"
	d["domain.firmware.bootloader.efi.secureBoot"] == false

	# A VM that names its bootloader keeps it.
	own := json.patch(spec, [{"op": "add", "path": "/domain/firmware", "value": {"bootloader": {"efi": {"secureBoot": false}}}}])
	q := defaults.plan with input as {"object": {"metadata": {"name": "a"}}, "spec": own, "machines": {"arm64": ["virt"]}}
	e := {concat(".", [sprintf("%v", [s]) | some s in x.path]): x.value | some x in defaults.defaults with input as {"spec": own, "plan": q, "domain": _domain}}
	not e["domain.firmware.bootloader.efi.secureBoot"]
}
