package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/virt-rules/virt-rules/internal/eval"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// exitStatus is an error that only sets the exit status: nothing more is printed.
type exitStatus int

func (s exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(s)) }

// statusError is err, exiting with status.
type statusError struct {
	status int
	err    error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// withStatus makes any error of run exit with status.
func withStatus(status int, run func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := run(cmd, args); err != nil && !errors.As(err, new(exitStatus)) {
			return &statusError{status: status, err: err}
		} else if err != nil {
			return err
		}
		return nil
	}
}

// diffReport is diff's -o json: the revisions compared and every change.
type diffReport struct {
	BaseRevision string        `json:"baseRevision"`
	NewRevision  string        `json:"newRevision"`
	Changes      []eval.Change `json:"changes"`
	// Errors are the objects in error under the new bundle (as eval reports them): not
	// decided by it. An object in error under one bundle only is also a change (decision
	// "errors").
	Errors []*manifest.Error `json:"errors"`
}

func newDiffCommand() *cobra.Command {
	var (
		b      bundleFlags
		base   string
		output string
		now    string
		cands  bool
		in     inputFlags
	)
	cmd := &cobra.Command{
		Use:   "diff --bundle NEW [--base OLD] [flags] PATH... | --kubeconfig FILE",
		Short: "List every decision a new bundle would change, with both sides' explanations",
		Long: `diff decides the same objects (manifests, or a live cluster with --kubeconfig) with two
bundles, the base (--base, default: the embedded one) and the new one (--bundle), and lists
every decision that differs: a VMI's MigrationPolicy and configuration, a migration's
candidate nodes and reason, a node's migratability level, a first scheduling's affinity, a
pool's plan (and, with --candidates, where each VMI not migrating could go). Each change
carries both sides' results with their explanations.

Objects in error (as eval reports them) are listed under the changes, and on stderr; an
object in error under one bundle only is also a change.

Exit status: 0 no decision changes and no object in error, 1 some decisions change or some
objects are in error (the report is complete for the rest), 2 the run could not happen (bad
flags, a bundle refused, no input), so it gates a CI pipeline.`,
		Example: `  virt-rules diff --bundle examples/custom-bundle/virt-rules-custom.tar.gz -o table examples/pool/
  virt-rules diff --base v1.tar.gz --bundle v2.tar.gz --kubeconfig ~/.kube/config -o json`,
		Args: withStatus(2, in.args),
		RunE: withStatus(2, func(cmd *cobra.Command, paths []string) error {
			if b.path == "" {
				return errors.New("--bundle: want the new bundle (a directory or .tar.gz)")
			}
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %s: want table or json", output)
			}
			warn := warner(cmd.ErrOrStderr())
			newEngine, err := b.engine(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("--bundle %s: %w", b.path, err)
			}
			baseFlags := b
			baseFlags.path = base
			baseEngine, err := baseFlags.engine(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("--base %s: %w", base, err)
			}
			objs, unreadable, at, err := in.readAt(cmd, paths, warn, now)
			if err != nil {
				return err
			}
			opts := eval.Options{Explain: true, Now: at, Candidates: cands}
			// The new side's warnings are the base side's: the inputs are the same.
			was, err := eval.Run(cmd.Context(), baseEngine, objs, opts)
			if err != nil {
				return fmt.Errorf("base bundle: %w", err)
			}
			opts.Warn = warn
			is, err := eval.Run(cmd.Context(), newEngine, objs, opts)
			if err != nil {
				return fmt.Errorf("new bundle: %w", err)
			}
			changes, err := eval.Compare(was, is)
			if err != nil {
				return err
			}
			is.AddErrors(unreadable...)
			r := diffReport{BaseRevision: baseEngine.Revision(), NewRevision: newEngine.Revision(), Changes: changes, Errors: is.Errors}
			if r.Changes == nil {
				r.Changes = []eval.Change{}
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				err = enc.Encode(r)
			} else {
				err = writeDiffTable(cmd.OutOrStdout(), r)
			}
			if err != nil {
				return err
			}
			if err := objectErrors(cmd.ErrOrStderr(), r.Errors); err != nil {
				return err
			}
			if len(changes) > 0 {
				return exitStatus(1)
			}
			return nil
		}),
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &statusError{status: 2, err: err} })
	b.register(cmd)
	cmd.Flags().StringVar(&base, "base", "", "the bundle `PATH` decisions are compared with (default: the embedded one)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&now, "now", "", "the `TIME` (RFC 3339) plans are made for (default: now)")
	cmd.Flags().BoolVar(&cands, "candidates", false, "compare where each VMI not migrating could migrate, too")
	in.register(cmd, true)
	return cmd
}

// writeDiffTable prints one row per change (what each side decides) and, under it, each side's
// explanation of the difference.
func writeDiffTable(w io.Writer, r diffReport) error {
	if len(r.Changes) == 0 {
		if _, err := fmt.Fprintf(w, "no decision changes (base %s, new %s)\n", r.BaseRevision, r.NewRevision); err != nil {
			return err
		}
		return writeErrorsTable(w, r.Errors)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DECISION\tOBJECT\tCHANGED\tBASE\tNEW")
	for _, c := range r.Changes {
		var was, is map[string]any
		_ = json.Unmarshal(c.Base, &was)
		_ = json.Unmarshal(c.New, &is)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Decision, c.Object, strings.Join(c.Fields, ","), summary(c.Decision, c.Fields, was), summary(c.Decision, c.Fields, is))
		// Without a tab, a line is no cell of a column: the reasons do not widen the table.
		for _, line := range explainChange(c.Decision, was, is) {
			fmt.Fprintf(tw, "  %s\n", line)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeErrorsTable(w, r.Errors)
}

// summary is one side of a change in a cell: the policy, the candidates and reason, the
// level, or the changed fields.
func summary(decision string, fields []string, side map[string]any) string {
	if side == nil {
		return "<none>"
	}
	switch decision {
	case "migrationPolicies":
		return compact(side["policy"])
	case "migrationTargets", "migrationCandidates":
		s := compact(side["candidateNodes"])
		if e, ok := side["error"].(map[string]any); ok {
			s += " " + compact(e["reason"])
		}
		return s
	case "nodeMigratability":
		return compact(side["level"])
	}
	parts := make([]string, 0, len(fields))
	for _, f := range fields {
		parts = append(parts, f+"="+compact(side[f]))
	}
	return strings.Join(parts, " ")
}

// explainChange is why each side decides as it does, where the decision explains itself: for
// a MigrationPolicy, each side's verdict on the other side's winner; for a migration, each node
// whose verdict changed.
func explainChange(decision string, was, is map[string]any) []string {
	if was == nil || is == nil {
		return nil
	}
	switch decision {
	case "migrationPolicies":
		var lines []string
		for _, side := range []struct {
			name        string
			this, other map[string]any
		}{{"base", was, is}, {"new", is, was}} {
			other, _ := side.other["policy"].(string)
			if other == "" {
				continue
			}
			if reason := candidateReason(side.this, other); reason != "" {
				lines = append(lines, fmt.Sprintf("%s: %s: %s", side.name, other, reason))
			}
		}
		return lines
	case "migrationTargets":
		base, next := nodeReasons(was), nodeReasons(is)
		var lines []string
		for _, node := range sortedStrings(base, next) {
			if base[node] != next[node] {
				lines = append(lines, fmt.Sprintf("%s: base: %s; new: %s", node, base[node], next[node]))
			}
		}
		return lines
	}
	return nil
}

func candidateReason(result map[string]any, policy string) string {
	x, _ := result["explanation"].(map[string]any)
	cands, _ := x["candidates"].([]any)
	for _, c := range cands {
		if m, ok := c.(map[string]any); ok && m["policy"] == policy {
			reason, _ := m["reason"].(string)
			return reason
		}
	}
	return ""
}

func nodeReasons(result map[string]any) map[string]string {
	out := map[string]string{}
	x, _ := result["explanation"].(map[string]any)
	nodes, _ := x["nodes"].([]any)
	for _, n := range nodes {
		if m, ok := n.(map[string]any); ok {
			name, _ := m["node"].(string)
			reason, _ := m["reason"].(string)
			out[name] = reason
		}
	}
	return out
}

func sortedStrings(maps ...map[string]string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range maps {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}
