package virtrules.migration.target_test

import data.virtrules.migration.target

# Exact fits ---------------------------------------------------------------------------------------

# node-2 with the given allocatable CPU, the pods' CPU requests on it, and a VMI requesting cpu.
_cpu_fit(allocatable, used, cpu) := {
	"migration": _migration(_to("node-2")),
	"vmi": _vmi_with({"domain": {"resources": {"requests": {"cpu": cpu}}}}),
	"nodes": [_nodes[0], object.union(_nodes[1], {"status": {"allocatable": {"cpu": allocatable}}}), _nodes[2]],
	"pods": [_pod("node-2", "Running", [{"cpu": c} | some c in used])],
}

test_exact_cpu_fit_is_a_fit if {
	# 500m + 300m + 100m is more than 900m in binary floats, not in millicores
	_decide(_cpu_fit("900m", ["500m", "300m"], "100m")).candidateNodes == ["node-2"]
	_decide(_cpu_fit("500m", ["100m", "200m"], "200m")).candidateNodes == ["node-2"]
	_decide(_cpu_fit("1100m", ["300m", "300m", "200m"], "300m")).candidateNodes == ["node-2"]
	inp := _cpu_fit("900m", ["500m", "300m"], "101m")
	_reason(inp) == "NoCapacity"
	_explained(inp)["node-2"] == "insufficient cpu: the VMI requests 101m; 900m allocatable, 800m requested by pods, 100m free"
}

test_exact_memory_fit_is_a_fit if {
	inp := object.union(_cpu_fit("4", [], "1"), {
		"vmi": _vmi_with({"domain": {"resources": {"requests": {"memory": "0.1G"}}}}),
		"nodes": [_nodes[0], object.union(_nodes[1], {"status": {"allocatable": {"memory": "0.3G"}}}), _nodes[2]],
		"pods": [_pod("node-2", "Running", [{"memory": "0.1G"}, {"memory": "100000000"}])],
	})
	_decide(inp).candidateNodes == ["node-2"]
	over := object.union(inp, {"pods": [_pod("node-2", "Running", [{"memory": "0.1G"}, {"memory": "100000000"}, {"memory": "1"}])]})
	_explained(over)["node-2"] == "insufficient memory: the VMI requests 0.1G; 0.3G allocatable, 200000001 requested by pods, 99999999 free"

	# each quantity is rounded up to a byte: 0.1Gi is 107374182.4 bytes, counted as 107374183
	thirds := object.union(inp, {
		"vmi": _vmi_with({"domain": {"resources": {"requests": {"memory": "0.1Gi"}}}}),
		"nodes": [_nodes[0], object.union(_nodes[1], {"status": {"allocatable": {"memory": "0.3Gi"}}}), _nodes[2]],
		"pods": [_pod("node-2", "Running", [{"memory": "0.1Gi"}, {"memory": "0.1Gi"}])],
	})
	_explained(thirds)["node-2"] == "insufficient memory: the VMI requests 0.1Gi; 0.3Gi allocatable, 214748366 requested by pods, 107374182 free"
}

test_each_quantity_is_rounded_up_on_its_own if {
	# 1n and 250001u count as 1m and 251m, as the scheduler counts them
	_decide(_cpu_fit("1", ["1n", "748m"], "250001u")).candidateNodes == ["node-2"]
	inp := _cpu_fit("1", ["1n", "749m"], "250001u")
	_explained(inp)["node-2"] == "insufficient cpu: the VMI requests 250001u; 1 allocatable, 750m requested by pods, 250m free"
}

test_whole_cpus_are_shown_as_cores if {
	_explained(_cpu_fit("2", ["3"], "1"))["node-2"] == "insufficient cpu: the VMI requests 1; 2 allocatable, 3 requested by pods, -1 free"
	_explained(_cpu_fit("2", ["2"], "1"))["node-2"] == "insufficient cpu: the VMI requests 1; 2 allocatable, 2 requested by pods, 0 free"
}

# Suffixes n and u ---------------------------------------------------------------------------------

test_nano_and_micro_cpu_are_quantities if {
	d := _decide(_cpu_fit("1", ["200000000n", "100000u"], "700m"))
	d.error == null
	d.candidateNodes == ["node-2"]
	_reason(_cpu_fit("1", ["200000000n", "100001u"], "700m")) == "NoCapacity"
	_decide(_cpu_fit("1000000000n", [], "1000000u")).candidateNodes == ["node-2"]
}

# The parser -------------------------------------------------------------------------------------------

# [quantity, millis, units], checked against resource.ParseQuantity's MilliValue and Value (where
# MilliValue overflows int64, for 1E, 1Ei and 2^63-1, the exact value is kept).
_quantities := [
	["0", 0, 0],
	["00", 0, 0],
	["0.0", 0, 0],
	["-0", 0, 0],
	["1", 1000, 1],
	["+.5", 500, 1],
	["5.", 5000, 5],
	["900m", 900, 1],
	["100m", 100, 1],
	["0.1", 100, 1],
	["250001u", 251, 1],
	["200000000n", 200, 1],
	["1n", 1, 1],
	["1.5Ki", 1536000, 1536],
	["0.1Gi", 107374182400, 107374183],
	["2Gi", 2147483648000, 2147483648],
	["8G", 8000000000000, 8000000000],
	["1k", 1000000, 1000],
	["1M", 1000000000, 1000000],
	["1T", 1000000000000000, 1000000000000],
	["1P", 1000000000000000000, 1000000000000000],
	["1E", 1000000000000000000000, 1000000000000000000],
	["1Ti", 1099511627776000, 1099511627776],
	["1Pi", 1125899906842624000, 1125899906842624],
	["1Ei", 1152921504606846976000, 1152921504606846976],
	["1e3", 1000000, 1000],
	["1E3", 1000000, 1000],
	["1e+03", 1000000, 1000],
	["1e-0", 1000, 1],
	["12e-4", 2, 1],
	["1.5e-3", 2, 1],
	["0.000000000001", 1, 1],
	["000123.4560000", 123456, 124],
	["9223372036854775807", 9223372036854775807000, 9223372036854775807],
	["-1.5m", -2, -1],
	["-2Ki", -2048000, -2048],
]

test_exact_quantities if {
	every case in _quantities {
		[text, millis, whole] := case
		target.exact_quantity(text, 3) == millis
		target.exact_quantity(text, 0) == whole
	}
}

test_scheduler_amounts_count_cpu_in_millicores_and_memory_in_bytes if {
	target.scheduler_amount("cpu", "1.5") == 1500
	target.scheduler_amount("memory", "1.5") == 2
	target.scheduler_amount("memory", "1Ki") == 1024
}

test_quantities_are_capped_at_the_largest_int64 if {
	largest := 9223372036854775807
	target.exact_quantity("8Ei", 0) == largest
	target.exact_quantity("16Ei", 3) == largest * 1000
	target.exact_quantity("9223372036854775808", 0) == largest
	target.exact_quantity("10000000000000000000", 0) == largest
	target.exact_quantity("1e999999999", 3) == largest * 1000
	target.exact_quantity("-1e999999999", 0) == 0 - largest
	target.exact_quantity("1e-999999999", 0) == 1
}

test_what_is_no_quantity if {
	every value in ["", "+", ".", "e3", "Mi", "1e", "1e+", "1.5.Gi", "1Kb", "1ki", "0x10", "1 Gi", " 1", "2 GB", "four", "1E3i", 1, null] {
		not target.exact_quantity(value, 0)
	}
}

test_every_kubernetes_quantity_is_valid_input if {
	every cpu in ["200000000n", "1000000u", "1e3", "0.5", ".5", "5.", "+1", "1E", "1Ei"] {
		object.get(_decide(_cpu_fit(cpu, [cpu], "1n")), ["error", "reason"], null) != "InvalidInput"
	}
	_decide(_cpu_fit("1", ["1u"], "1Mi")).error.reason == "NoCapacity"
}
