package virtrules.lib.affinity_test

import data.virtrules.lib.affinity

_name_term := {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}

_disk := {"key": "disktype", "operator": "In", "values": ["ssd"]}

_zone := {"key": "zone", "operator": "In", "values": ["a"]}

_gpu := {"key": "gpu", "operator": "Exists"}

test_term_becomes_the_only_required_term_without_affinity if {
	affinity.with_required_term(null, _name_term) == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_name_term]}}
}

test_term_becomes_the_only_required_term_when_only_preferred if {
	preferred := [{"weight": 5, "preference": {"matchExpressions": [_gpu]}}]
	got := affinity.with_required_term({"preferredDuringSchedulingIgnoredDuringExecution": preferred}, _name_term)
	got == {
		"preferredDuringSchedulingIgnoredDuringExecution": preferred,
		"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_name_term]},
	}
}

test_term_is_anded_into_every_ored_term if {
	vmi := {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
		{"matchExpressions": [_disk]},
		{"matchExpressions": [_zone], "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-9"]}]},
	]}}
	term := {"matchExpressions": [_gpu], "matchFields": _name_term.matchFields}
	got := affinity.with_required_term(vmi, term)
	got.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == [
		{"matchExpressions": [_disk, _gpu], "matchFields": _name_term.matchFields},
		{
			"matchExpressions": [_zone, _gpu],
			"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-9"]}, _name_term.matchFields[0]],
		},
	]
}

test_empty_required_list_is_like_none if {
	got := affinity.with_required_term({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}, {"matchExpressions": [_disk], "matchFields": []})
	got.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == [{"matchExpressions": [_disk]}]
}

test_preferred_term_is_appended if {
	existing := {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": {"matchExpressions": [_gpu]}}]}
	got := affinity.with_preferred_term(existing, 1, {"matchExpressions": [_disk], "matchFields": []})
	got.preferredDuringSchedulingIgnoredDuringExecution == [
		{"weight": 5, "preference": {"matchExpressions": [_gpu]}},
		{"weight": 1, "preference": {"matchExpressions": [_disk]}},
	]
}

test_preferred_term_without_affinity if {
	affinity.with_preferred_term(null, 3, {"matchExpressions": [_disk]}) == {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 3, "preference": {"matchExpressions": [_disk]}}]}
}

test_required_terms if {
	affinity.required_terms(null) == []
	affinity.required_terms({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_name_term]}}) == [_name_term]
}
