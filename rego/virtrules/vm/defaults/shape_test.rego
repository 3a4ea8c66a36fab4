package virtrules.vm.defaults_test

import data.virtrules.vm.defaults

test_identity_defaults_are_the_derived_values_the_user_left_unset if {
	spec := {
		"domain": {
			"memory": {"guest": "64Mi"},
			"devices": {"interfaces": [
				{"name": "default", "masquerade": {}},
				{"name": "vf", "sriov": {}},
				{"name": "mine", "bridge": {}, "macAddress": "02:00:00:00:00:07"},
				{"name": "other", "bridge": {}},
			]},
		},
		"networks": [{"name": "default", "pod": {}}, {"name": "vf", "multus": {}}, {"name": "mine", "multus": {}}, {"name": "other", "multus": {}}],
	}
	ids := defaults.identity_defaults with input as {"object": _vm, "spec": spec}
	ids == [
		{"path": ["domain", "devices", "interfaces", 0, "macAddress"], "value": defaults.derived_mac("demo/testvm", "default")},
		{"path": ["domain", "devices", "interfaces", 3, "macAddress"], "value": defaults.derived_mac("demo/testvm", "other")},
		{"path": ["domain", "firmware", "uuid"], "value": defaults.derived_uuid("demo/testvm")},
	]
	mine := json.patch(spec, [{"op": "add", "path": "/domain/firmware", "value": {"uuid": "5d307ca9-b3ef-428c-8861-06e72d69f223"}}])
	paths := [id.path | some id in defaults.identity_defaults] with input as {"object": _vm, "spec": mine}
	paths == [["domain", "devices", "interfaces", 0, "macAddress"], ["domain", "devices", "interfaces", 3, "macAddress"]]
}

test_identity_defaults_are_what_the_mapping_gives_those_fields if {
	ids := defaults.identity_defaults with input as {"object": {"metadata": {"namespace": "demo", "name": "testvm"}}, "spec": _spec}
	count(ids) == 2
	d := _defaults(_spec)
	every id in ids {
		d[concat(".", [sprintf("%v", [s]) | some s in id.path])] == id.value
	}
}

# Specs of every kind the rules know, some invalid, some unsupported.
_varied_specs := [
	_minimal,
	_spec,
	{
		"domain": {
			"machine": {"type": "q35"},
			"resources": {"requests": {"memory": "1Gi", "cpu": "2"}},
			"devices": {
				"disks": [{"name": "root", "disk": {}}, {"name": "db", "lun": {}}, {"name": "ci", "cdrom": {}}],
				"interfaces": [{"name": "default", "masquerade": {}}, {"name": "vf", "sriov": {}}],
			},
		},
		"networks": [{"name": "default", "pod": {}}, {"name": "vf", "multus": {"networkName": "sriov-net"}}],
		"volumes": [
			{"name": "root", "dataVolume": {"name": "vm-7-root"}},
			{"name": "db", "persistentVolumeClaim": {"claimName": "vm-7-db", "readOnly": true}},
			{"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config\nhostname: vm-7"}},
		],
	},
	{
		"domain": {"memory": {"guest": "64Mi"}, "devices": {"disks": [{"name": "odd", "disk": {}}]}},
		"volumes": [{"name": "odd", "someNewSource": {"x": 1}}, "not an object", {"name": "flat", "dataVolume": "not an object"}],
		"networks": 5,
	},
]

test_the_plan_and_the_mapping_read_no_more_of_a_spec_than_its_shape if {
	every spec in _varied_specs {
		shaped := defaults.shape_spec with input as {"object": _vm, "spec": spec}
		_plan(shaped) == _plan(spec)
		_defaults(shaped) == _defaults(spec)
	}
}

test_objects_of_one_template_have_one_shape if {
	a := _varied_specs[2]
	b := json.patch(a, [
		{"op": "replace", "path": "/volumes/0/dataVolume/name", "value": "vm-8-root"},
		{"op": "replace", "path": "/volumes/2/cloudInitNoCloud/userData", "value": "#cloud-config\nhostname: vm-8"},
		{"op": "replace", "path": "/networks/1/multus/networkName", "value": "other-net"},
	])
	shape_a := defaults.shape with input as {"object": {"metadata": {"namespace": "demo", "name": "vm-7"}}, "spec": a}
	shape_b := defaults.shape with input as {"object": {"metadata": {"namespace": "demo", "name": "vm-8"}}, "spec": b}
	shape_a.spec == shape_b.spec
	shape_a.identity_defaults != shape_b.identity_defaults
}

test_what_the_rules_read_tells_shapes_apart if {
	base := _varied_specs[2]
	every patch in [
		[{"op": "replace", "path": "/volumes/0/name", "value": "other"}],
		[{"op": "replace", "path": "/volumes/0", "value": {"name": "root", "containerDisk": {"image": "x"}}}],
		[{"op": "replace", "path": "/networks/0", "value": {"name": "default", "multus": {}}}],
		[{"op": "add", "path": "/domain/devices/disks/0/serial", "value": "s"}],
		[{"op": "replace", "path": "/volumes", "value": "not a list"}],
	] {
		other := json.patch(base, patch)
		shaped := defaults.shape_spec with input as {"object": _vm, "spec": other}
		shaped != defaults.shape_spec with input as {"object": _vm, "spec": base}
	}
}
