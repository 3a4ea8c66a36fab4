# VM defaults (3) - shapes (package documentation in plan.rego).
#
# What an object's defaults depend on, so that objects of one shape (VMs of one template, each
# with its own name, disks and cloud-init data) are planned, defined and mapped once.
#
# Input of `shape`: as `plan`'s (object, spec, request), without machines.
#
# The answer: {"spec": the object's spec as far as `plan` and `defaults` read it,
# "identity_defaults": the defaults that are the object's own}. The promise it makes: for the
# same kind and machine types, two objects whose shape specs are equal get the same defaults
# but their identity defaults, which are in their places in both. The defaulter service keeps
# defaults by shape on this promise (its shape cache) and checks it on every answer it keeps.
# A bundle that reads more of the spec than `spec` keeps, or derives more from the metadata
# than `identity_defaults`, must change this file with it, or drop `shape`: without it every
# object is evaluated in full. shape_test.rego checks the promise on varied objects.
package virtrules.vm.defaults

# Objects whose defaults depend on more than their spec and identity (a VM with an
# instancetype or preference) have no shape: each is evaluated in full.
shape := {"spec": shape_spec, "identity_defaults": identity_defaults} if {
	every ref in ["instancetype", "preference"] {
		object.get(input.object, ["spec", ref], null) == null
	}
}

# The spec without what the rules never read: what volumes and networks point at (claim and
# DataVolume names, images, cloud-init data, Multus network names). The rules read only their
# names and the kinds of their sources. A list with anything but objects in it stays as it is,
# so an invalid spec is never the shape of a valid one.
shape_spec := object.union(_spec, {field: shaped |
	some field in ["volumes", "networks"]
	list := _spec[field]
	is_array(list)
	shaped := [object.union(object.remove(x, sources), {key: {} | some key in sources}) |
		some x in list
		is_object(x)
		sources := {key | some key, value in x; key != "name"; is_object(value)}
	]
	count(shaped) == count(list)
})

# The defaults that come from the object's identity rather than from its spec: the firmware
# UUID and the MACs of the interfaces the plan defines, for the fields the user left unset, as
# {"path", "value"} in the order `defaults` (mapping.rego) gives them.
identity_defaults := [{"path": path, "value": value} |
	some [path, value] in sort(_identity_candidates)
	object.get(_spec, path, null) == null
]

_identity_candidates contains [["domain", "firmware", "uuid"], firmware_uuid]

# The interfaces the plan defines (passthrough ones are not), by their index in the spec.
_identity_candidates contains [["domain", "devices", "interfaces", i, "macAddress"], derived_mac(identity, object.get(iface, "name", ""))] if {
	some i, iface in _interfaces
	not _passthrough(iface)
}
