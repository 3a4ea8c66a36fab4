# METADATA
# title: Node drain preview
# description: |
#   What draining nodes (kubectl drain: cordon, then evict every pod) does to the VMIs on them,
#   before anyone does it. KubeVirt's eviction webhook turns the eviction of a VMI's
#   virt-launcher pod into a live migration, a shutdown or a refusal, by the VMI's eviction
#   strategy as KubeVirt resolves it (the VMI's spec.evictionStrategy, else the KubeVirt CR's
#   spec.configuration.evictionStrategy, else KubeVirt's default None; v1.8's
#   migrations.VMIEvictionStrategy and virt-config), and its evacuation controller starts the
#   migrations of the VMIs it may migrate. Where each migration lands is the migration target
#   decision's (virtrules.migration.target, reused here, not copied) on the drained nodes
#   cordoned, with the capacity the evacuees placed before it took.
#
#   Two entrypoints, so that the capacity taken accumulates: `evacuees` orders the VMIs and
#   says what the eviction does to each; the engine then asks `placement` for each VMI to
#   migrate, in that order, adding each placed VMI's target pod (what placement says it
#   requests, on its target node) to the pods of the next ask. The migration target decision
#   judges each node on that node and the pods on it, and reads of a VMI only its shape
#   (target.shape): so for a VMI of a shape placed before, the engine asks again only about
#   the nodes that took a VMI since, handing over the other candidates as they were scored
#   (`scored`).
#
#   Input of `evacuees`:
#     drain:    {nodes: the names of the nodes drained}
#     vmis:     every VirtualMachineInstance (those on other nodes are not evacuees)
#     kubevirt: optional, the cluster's KubeVirt CR (its cluster-wide eviction strategy)
#     sourcePods: optional, each VMI's virt-launcher pod by namespace/name, for its shape
#
#   Input of `placement`: that of the migration target decision, as the evacuation asks it:
#   migration (the one KubeVirt's evacuation controller creates, adding no constraint), vmi,
#   nodes (the drained ones cordoned: spec.unschedulable, as kubectl drain leaves them), pods
#   (with the target pods of the evacuees placed before), sourcePod, kubevirt; and optionally
#   scored: candidates of a VMI of the same shape, as [score, name], whose nodes took no VMI
#   since, which the nodes given do not repeat (only the nodes that took one, and the VMI's own).
package virtrules.migration.drain

import data.virtrules.migration.target

_drained := {name | some name in object.get(input, ["drain", "nodes"], [])}

_vmi_key(vmi) := sprintf("%s/%s", [object.get(vmi.metadata, "namespace", "default"), vmi.metadata.name])

_node(vmi) := object.get(vmi, ["status", "nodeName"], "")

# METADATA
# description: |
#   The eviction strategy of a VMI as KubeVirt resolves it: the VMI's, else the KubeVirt CR's
#   cluster-wide one (kubevirt may be null), else None.
eviction_strategy(vmi, kubevirt) := vmi.spec.evictionStrategy if {
	is_string(vmi.spec.evictionStrategy)
} else := kubevirt.spec.configuration.evictionStrategy if {
	is_string(kubevirt.spec.configuration.evictionStrategy)
} # KubeVirt v1.8's default (virt-config: EvictionStrategyNone)

else := "None"

# KubeVirt's LiveMigratable condition: [status, reason, message].
_migratable_condition(vmi) := [c.status, object.get(c, "reason", ""), object.get(c, "message", "")] if {
	some c in object.get(vmi, ["status", "conditions"], [])
	c.type == "LiveMigratable"
} else := ["Unknown", "", "the VMI has no LiveMigratable condition"]

_migratable(vmi) if _migratable_condition(vmi)[0] == "True"

_not_migratable_message(vmi) := sprintf("not live-migratable (LiveMigratable %s%s): %s", [
	cond[0], _reason_text(cond[1]), cond[2],
]) if {
	cond := _migratable_condition(vmi)
}

_reason_text("") := ""

_reason_text(reason) := sprintf(", %s", [reason]) if reason != ""

# A VMI KubeVirt is done with, or is deleting, is not evacuated: it is going anyway.
_going(vmi) if object.get(vmi, ["status", "phase"], "") in {"Succeeded", "Failed"}

_going(vmi) if vmi.metadata.deletionTimestamp

# What the eviction of each evacuee's launcher pod does: its action, reason code and message.
_outcome(_, "None") := {"action": "shutdown", "reason": "EvictionStrategyNone", "message": "evictionStrategy None: the eviction deletes its virt-launcher pod and the VMI stops (its VM, if it runs always, starts a new one where it can)"}

_outcome(_, "External") := {"action": "external", "reason": "EvictionStrategyExternal", "message": "evictionStrategy External: KubeVirt refuses the eviction and marks the VMI (status.evacuationNodeName) for an external controller; the drain waits until that controller moves or stops it"}

_outcome(vmi, "LiveMigrate") := {"action": "migrate", "reason": "", "message": ""} if _migratable(vmi)

_outcome(vmi, "LiveMigrate") := {"action": "stuck", "reason": "NotLiveMigratable", "message": sprintf("evictionStrategy LiveMigrate, %s: KubeVirt refuses the eviction, and the drain cannot finish", [_not_migratable_message(vmi)])} if {
	not _migratable(vmi)
}

_outcome(vmi, "LiveMigrateIfPossible") := {"action": "migrate", "reason": "", "message": ""} if _migratable(vmi)

_outcome(vmi, "LiveMigrateIfPossible") := {"action": "shutdown", "reason": "NotLiveMigratable", "message": sprintf("evictionStrategy LiveMigrateIfPossible, %s: the eviction stops it", [_not_migratable_message(vmi)])} if {
	not _migratable(vmi)
}

_outcome(_, strategy) := {"action": "stuck", "reason": "UnknownEvictionStrategy", "message": sprintf("evictionStrategy %v: KubeVirt knows None, LiveMigrate, LiveMigrateIfPossible and External", [strategy])} if {
	not strategy in {"None", "External", "LiveMigrate", "LiveMigrateIfPossible"}
}

# METADATA
# description: |
#   The VMIs on the drained nodes that KubeVirt evacuates, in the order the preview places
#   them: by node name, then namespace/name (KubeVirt's evacuation controller takes each node's
#   VMIs in its informer's order, which no input fixes, and starts at most
#   parallelMigrationsPerCluster migrations at once, parallelOutboundMigrationsPerNode from one
#   node; those limits pace the drain, they do not change where the VMIs go). Each with its
#   node, its eviction strategy and what its eviction does: action migrate (to be placed),
#   shutdown, external or stuck, with a reason code and a message.
# entrypoint: true
evacuees := [entry |
	some [_, _, vmi] in sort([[_node(vmi), _vmi_key(vmi), vmi] |
		some vmi in object.get(input, "vmis", [])
		_node(vmi) in _drained
		not _going(vmi)
	])
	strategy := eviction_strategy(vmi, object.get(input, "kubevirt", null))
	outcome := _outcome(vmi, strategy)
	entry := object.union_n([
		{"vmi": _vmi_key(vmi), "node": _node(vmi), "evictionStrategy": strategy},
		outcome,
		_shape(vmi, outcome.action),
	])
]

# A VMI to migrate has the shape the migration target decision reads of it and its pod.
_shape(vmi, "migrate") := {"shape": target.shape(vmi, object.get(input, ["sourcePods", _vmi_key(vmi)], null))}

_shape(_, action) := {} if action != "migrate"

# Placement ------------------------------------------------------------------------------------

# The placement's input is the migration target decision's own, so its rules are asked as
# they are, on the same input, not copied: its decision (candidates and error), not its
# explanation, which also words a verdict for every other node and would cost each evacuee
# more than asking for its candidates does.
_decided := target.decision

_candidates := _decided.candidateNodes

# kube-scheduler's default NodeResourcesFit score (LeastAllocated, CPU and memory weighted
# alike): the share of a node's allocatable left free once the pod is on it, in percent,
# summed over the two (kube-scheduler averages them: the order is the same). A resource the
# node does not list scores 0. It runs for every candidate of every evacuee.
_scores := [[score, name] |
	some name in _candidates
	allocatable := object.get(target.node_allocatable, name, _nothing)
	used := object.get(_node_requests, name, _nothing)
	score := _score(allocatable, used)
]

# One call per candidate, of its allocatable and the requests on it: OPA keeps a function's
# result by its arguments, so nodes alike (the same allocatable, nothing requested yet) are
# scored once.
_score(allocatable, used) := _free(allocatable, used, "cpu") + _free(allocatable, used, "memory")

_node_requests := target.node_requests

_nothing := {}

_free(allocatable, used, resource) := (((amount - object.get(used, resource, 0)) - object.get(target.requested, resource, 0)) * 100) / amount if {
	amount := allocatable[resource]
	amount > 0
} else := 0

# With the candidates scored before, of a VMI of the same shape on nodes that have not changed.
_all_scores := array.concat(_scores, object.get(input, "scored", []))

_all_candidates := sort([name | some [_, name] in _all_scores])

# The candidate kube-scheduler's resource scoring prefers; the first name on a tie. The scores
# are a list, not a set: OPA hashes numbers by their integer part, so a set of scores that
# differ only in their fractions compares each with all the others.
_best := max([score | some [score, _] in _all_scores])

_target_node := min({name | some [score, name] in _all_scores; score == _best})

# METADATA
# description: |
#   Where one evacuee's migration lands: its candidates (the migration target decision's, the
#   drained nodes cordoned) and the one the preview places it on, the candidate left with the
#   most free CPU and memory as kube-scheduler's default scoring prefers (the real scheduler
#   adds other scores, so among several candidates it may pick another), with what its target
#   pod requests there (the target decision's `requested`, in scheduler amounts: millicores,
#   bytes, counts), which the evacuees placed after it find taken; or, without a candidate, the
#   target decision's reason code and message (NoCapacity, NoMatchingNode,
#   ConflictsWithVMConstraints, ...). `scores` are the candidates as scored, for the next VMI
#   of the same shape.
# entrypoint: true
placement := {
	"targetNode": _target_node, "candidateNodes": _all_candidates, "requested": target.requested,
	"scores": _all_scores, "error": null,
} if {
	count(_all_candidates) > 0
} else := {"targetNode": "", "candidateNodes": [], "requested": {}, "scores": [], "error": _decided.error}
