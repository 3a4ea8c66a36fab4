# Resource quantities read exactly (package documentation in target.rego): the fit check
# compares integers as the scheduler does, CPU in whole millicores and everything else in whole
# units (bytes), each quantity rounded up. units.parse is no use here: it yields binary floats,
# so that 500m + 300m + 100m can exceed 900m, and it refuses the suffixes n and u.
package virtrules.migration.target

# Every quantity Kubernetes accepts (resource.ParseQuantity's grammar).
_quantity_pattern := `^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$`

# The parts of a quantity that matches _quantity_pattern: sign, whole digits, fraction digits, suffix.
_quantity_parts := `^([+-]?)([0-9]*)\.?([0-9]*)(.*)$`

# [power of ten, power of two] of each suffix; [eE]<n> is the power of ten n.
_suffixes := {
	"": [0, 0],
	"n": [-9, 0], "u": [-6, 0], "m": [-3, 0],
	"k": [3, 0], "M": [6, 0], "G": [9, 0], "T": [12, 0], "P": [15, 0], "E": [18, 0],
	"Ki": [0, 10], "Mi": [0, 20], "Gi": [0, 30], "Ti": [0, 40], "Pi": [0, 50], "Ei": [0, 60],
}

_powers_of_two := {0: 1, 10: 1024, 20: 1048576, 30: 1073741824, 40: 1099511627776, 50: 1125899906842624, 60: 1152921504606846976}

# Magnitudes are capped at 2^63-1 units, as Kubernetes caps quantities; the cap also keeps the
# arithmetic small for absurd exponents such as 1e999999999.
_max_units := 9223372036854775807

# METADATA
# description: |
#   A Kubernetes quantity as an exact integer number of units of 10^-scale (scale 3:
#   millicores), rounded up in magnitude as Quantity.MilliValue (scale 3) and Quantity.Value
#   (scale 0) round; undefined for a string that is no quantity, or for a non-string.
exact_quantity(value, scale) := _signed(sign, _magnitude(concat("", [whole, fraction]), ten - count(fraction), two, scale)) if {
	is_string(value)
	regex.match(_quantity_pattern, value)
	[[_, sign, whole, fraction, suffix]] := regex.find_all_string_submatch_n(_quantity_parts, value, 1)
	[ten, two] := _suffix_exponents(suffix)
}

_suffix_exponents(suffix) := _suffixes[suffix]

_suffix_exponents(suffix) := [_signed(sign, to_number(digits)), 0] if {
	[[_, sign, digits]] := regex.find_all_string_submatch_n(`^[eE]([+-]?)0*([0-9]+)$`, suffix, 1)
}

# The magnitude digits * 10^ten * 2^two in units of 10^-scale, rounded up, capped.
_magnitude(digits, ten, two, scale) := 0 if {
	trim_left(digits, "0") == ""
} else := _max_units * _pow10(scale) if {
	# at least 10^19 units (2^10 > 10^3), more than the cap
	[significant, power] := _significant(digits, ten)
	(count(significant) + power) + ((two * 3) / 10) > 19
} else := min({_ceil_shift(to_number(significant) * _powers_of_two[two], power + scale), _max_units * _pow10(scale)}) if {
	[significant, power] := _significant(digits, ten)
}

# digits * 10^ten as [digits without leading or trailing zeros, power of ten].
_significant(digits, ten) := [trimmed, (ten + count(stripped)) - count(trimmed)] if {
	stripped := trim_left(digits, "0")
	trimmed := trim_right(stripped, "0")
}

# n * 10^shift rounded up, for an integer n > 0, by moving the decimal point in n's digits
# (OPA divides big numbers inexactly).
_ceil_shift(n, shift) := to_number(concat("", [format_int(n, 10), _zeros(shift)])) if {
	shift >= 0
} else := 1 if {
	count(format_int(n, 10)) <= 0 - shift
} else := to_number(substring(text, 0, count(text) + shift)) + _round_up(substring(text, count(text) + shift, -1)) if {
	text := format_int(n, 10)
}

_round_up(dropped) := 0 if {
	trim_left(dropped, "0") == ""
} else := 1

_pow10(n) := to_number(concat("", ["1", _zeros(n)]))

_zeros(n) := concat("", ["0" | some i in numbers.range(0, n); i > 0])

# METADATA
# description: |
#   A quantity of a resource as the scheduler's fit check counts it: CPU in millicores, other
#   resources (memory) in bytes, each rounded up.
scheduler_amount(resource, value) := exact_quantity(value, _scale(resource))

_scale("cpu") := 3

_scale(resource) := 0 if resource != "cpu"
