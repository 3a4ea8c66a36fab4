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
	kvFile := fs.String("kubevirt", "", "YAML of the KubeVirt CR whose configuration the cluster has (default: an empty spec, amd64)")
	emulation := fs.Bool("emulation", false, "the node has no /dev/kvm (the converter then asks for software emulation)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if err := fileArgs("convert", fs.Args()); err != nil {
		return err
	}
	c, err := newCluster(*kvFile)
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	node, err := newNode(*emulation)
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	docs, readErr := readDocuments(fs.Args(), stdin)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for _, d := range docs {
		if err := enc.Encode(c.convert(d, node)); err != nil {
			return fmt.Errorf("convert: write: %w", err)
		}
	}
	if readErr != nil {
		return fmt.Errorf("convert: %w", readErr)
	}
	return nil
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
	seedUUIDs(kind, ns, name)
	c.logs.drain()
	c.client.takeLookups()
	err := c.start(d, n, &line)
	line.Notes = append(line.Notes, c.client.takeLookups()...)
	line.Notes = uniq(append(line.Notes, c.logs.notes()...))
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
		w, err := c.mutate(o, userName)
		warn(w)
		if err != nil {
			return err
		}
		if err := o.persist(); err != nil {
			return err
		}
		line.Name = o.name
		w, err = c.validateOrRefuse(o, userName)
		warn(w)
		if err != nil {
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
	w, err := c.mutate(vmi, user)
	warn(w)
	if err != nil {
		return err
	}
	if err := vmi.persist(); err != nil {
		return err
	}
	line.Name = vmi.name
	w, err = c.validateOrRefuse(vmi, user)
	warn(w)
	if err != nil {
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
