//go:build virtrules_oracle

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	admissionv1 "k8s.io/api/admission/v1"
)

// admitLine is admit's answer for one input document.
type admitLine struct {
	Source    string   `json:"source"`
	Kind      string   `json:"kind"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Skipped   bool     `json:"skipped,omitempty"`
	Allowed   *bool    `json:"allowed,omitempty"` // absent for a skipped document
	Message   string   `json:"message"`
	Causes    []cause  `json:"causes"`
	Warnings  []string `json:"warnings"`
	Notes     []string `json:"notes"`
	Error     string   `json:"error,omitempty"`
}

type cause struct {
	Type    string `json:"type"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

func admitCmd(args []string, stdin io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("admit", flag.ContinueOnError)
	kvFile := fs.String("kubevirt", "", "YAML of the KubeVirt CR whose configuration the cluster has (default: an empty spec, status.defaultArchitecture -arch)")
	arch := addArchFlag(fs)
	mutate := fs.Bool("mutate", false, "run the mutating webhook of the object's kind first, and admit what it makes of it")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	return eachDocument("admit", fs.Args(), *kvFile, string(*arch), stdin, out, func(c *cluster, _ []document) (func(document) any, error) {
		return func(d document) any { return c.admit(d, *mutate) }, nil
	})
}

// admit answers as virt-api's validating webhook for d's kind on its create.
func (c *cluster) admit(d document, mutate bool) admitLine {
	kind, ns, name := d.kindOf()
	line := admitLine{Source: d.source, Kind: kind, Namespace: ns, Name: name,
		Causes: []cause{}, Warnings: []string{}, Notes: []string{}}
	if !d.isKubeVirt() {
		line.Skipped = true
		line.Notes = append(line.Notes, skippedNote(d))
		return line
	}
	err := c.traced(kind, ns, name, &line.Notes, func() error { return c.admitObject(d, mutate, &line) })
	if err != nil {
		line.Allowed = new(bool)
		line.Error = err.Error()
	}
	return line
}

func (c *cluster) admitObject(d document, mutate bool, line *admitLine) error {
	o, notes, err := newObject(d)
	line.Notes = append(line.Notes, notes...)
	if err != nil {
		return err
	}
	line.Namespace = o.namespace
	if mutate {
		w, err := c.mutate(o, userName)
		line.Warnings = append(line.Warnings, w...)
		var r *refusal
		if errors.As(err, &r) {
			line.Notes = append(line.Notes, "refused by "+r.webhook)
			line.answer(r.resp)
			return nil
		}
		if err != nil {
			return err
		}
	}
	if err := o.persist(); err != nil {
		return err
	}
	line.Name = o.name
	resp, err := c.validate(o, userName)
	if err != nil {
		return err
	}
	line.answer(resp)
	return nil
}

// answer copies a webhook's answer into the line.
func (l *admitLine) answer(resp *admissionv1.AdmissionResponse) {
	l.Allowed = &resp.Allowed
	l.Warnings = append(l.Warnings, resp.Warnings...)
	if resp.Result == nil {
		return
	}
	l.Message = resp.Result.Message
	if resp.Result.Details == nil {
		return
	}
	for _, c := range resp.Result.Details.Causes {
		l.Causes = append(l.Causes, cause{Type: string(c.Type), Field: c.Field, Message: c.Message})
	}
}
