package controllers

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/virt-rules/virt-rules/internal/intern"
	"github.com/virt-rules/virt-rules/internal/nodetrim"
)

// TrimNode is the manager's cache transform for Nodes. It keeps what a reader of a cached Node
// reads, by the rule `virt-rules eval` trims its Nodes with too (internal/nodetrim: metadata
// but managedFields, spec, and of status allocatable and conditions), with its label,
// annotation and condition strings interned. TestTrimNodeKeeps lists what the controllers,
// webhooks, Rego rules and reference implementations read of a node.
func TrimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	nodetrim.Typed(node)
	node.Labels = intern.Default.Strings(node.Labels)
	node.Annotations = intern.Default.Strings(node.Annotations)
	for i := range node.Status.Conditions {
		c := &node.Status.Conditions[i] // the same few types, statuses, reasons and messages on every node
		c.Type = corev1.NodeConditionType(intern.Default.String(string(c.Type)))
		c.Status = corev1.ConditionStatus(intern.Default.String(string(c.Status)))
		c.Reason, c.Message = intern.Default.String(c.Reason), intern.Default.String(c.Message)
	}
	return node, nil
}
