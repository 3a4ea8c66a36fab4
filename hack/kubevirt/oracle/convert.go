//go:build virtrules_oracle

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	v1 "kubevirt.io/api/core/v1"
)

// convertLine is convert's answer for one input document.
type convertLine struct {
	Source    string          `json:"source"`
	Kind      string          `json:"kind"`
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Skipped   bool            `json:"skipped,omitempty"`
	VM        json.RawMessage `json:"vm,omitempty"`
	VMI       json.RawMessage `json:"vmi,omitempty"`
	Domain    string          `json:"domain,omitempty"`
	Notes     []string        `json:"notes"`
	Error     string          `json:"error,omitempty"`
}

func convertCmd(args []string, stdin io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("convert", flag.ContinueOnError)
	kvFile := fs.String("kubevirt", "", "YAML of the KubeVirt CR whose configuration the cluster has (default: an empty spec, status.defaultArchitecture -arch)")
	arch := addArchFlag(fs)
	emulation := fs.Bool("emulation", false, "the node has no /dev/kvm (the converter then asks for software emulation)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	return eachDocument("convert", fs.Args(), *kvFile, string(*arch), stdin, out, func(c *cluster, _ []document) (func(document) any, error) {
		node, err := newNode(*emulation, c.arch)
		if err != nil {
			return nil, err
		}
		return func(d document) any { return c.convert(d, node) }, nil
	})
}

// create creates o as user through kube-apiserver's admission: virt-api's mutating webhook,
// the name and UID the apiserver gives, virt-api's validating webhook (a refusal is an
// error). Warnings go to warn; name gets the name o ends up with.
func (c *cluster) create(o *object, user string, name *string, warn func([]string)) error {
	w, err := c.mutate(o, user)
	warn(w)
	if err != nil {
		return err
	}
	if err := o.persist(); err != nil {
		return err
	}
	*name = o.name
	w, err = c.validateOrRefuse(o, user)
	warn(w)
	return err
}

// convert starts the object of d the way KubeVirt does, up to the domain XML.
func (c *cluster) convert(d document, n *node) convertLine {
	kind, ns, name := d.kindOf()
	line := convertLine{Source: d.source, Kind: kind, Namespace: ns, Name: name, Notes: []string{}}
	if !d.isKubeVirt() {
		line.Skipped = true
		line.Notes = append(line.Notes, skippedNote(d))
		return line
	}
	err := c.traced(kind, ns, name, &line.Notes, func() error { return c.start(d, n, &line) })
	if err != nil {
		line.Error = err.Error()
	}
	return line
}

func (c *cluster) start(d document, n *node, line *convertLine) error {
	o, notes, err := newObject(d)
	line.Notes = append(line.Notes, notes...)
	if err != nil {
		return err
	}
	line.Namespace = o.namespace
	warn := func(warnings []string) {
		for _, w := range warnings {
			line.Notes = append(line.Notes, "virt-api warning: "+w)
		}
	}
	vmi, user := o, userName
	if o.kind == v1.VirtualMachineGroupVersionKind.Kind {
		if err := c.create(o, userName, &line.Name, warn); err != nil {
			return err
		}
		line.VM = o.raw
		vmi, notes, err = c.startVM(o.raw)
		line.Notes = append(line.Notes, notes...)
		if err != nil {
			return err
		}
		user = c.controllerUser()
	}
	if err := c.create(vmi, user, &line.Name, warn); err != nil {
		return err
	}
	line.VMI = vmi.raw
	domain, notes, err := c.domainXML(vmi.raw, n)
	line.Notes = append(line.Notes, notes...)
	if err != nil {
		return err
	}
	if domain == "" {
		return errors.New("the converter gave no domain")
	}
	line.Domain = domain
	return nil
}
