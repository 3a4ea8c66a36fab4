package engine

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/virt-rules/virt-rules/internal/manifest"
)

// The trial.
//
// Before a bundle is activated (embedded, from a path or from a server, tests or no tests) it
// decides one representative input per decision, each evaluation under the trial budget
// (WithTrialBudget). The inputs are shipped with the binary: the manifests of examples/
// (copied byte for byte under testdata/trial/, which TestTrialInputsAreTheExamples checks)
// and the recorded VM and libvirt domain of testdata/. The decisions go through the same
// typed methods the controllers call, on a shadow engine serving the candidate, so every
// entrypoint, the partial evaluation and the decoding of each answer are tried. A bundle that
// breaks the budget is refused (ReasonBudget), one that fails to decide is refused
// (ReasonTrial); an answer that calls the input malformed (ErrMalformedInput) is an answer.

//go:embed testdata/trial testdata/vmdefaults-vm.json testdata/vmdefaults-domain.xml
var trialFiles embed.FS

// trialCase is one decision of the trial and the input it decides.
type trialCase struct {
	decision string // the Rego package of the decision, as entrypoints name it
	input    string // where the input comes from, for messages
	run      func(context.Context, *Engine, *trialInputs) error
}

// trialInputs are the objects of the trial's manifests, by example directory.
type trialInputs struct {
	objects   map[string][]manifest.Object
	vm        struct{ Object, Spec map[string]any }
	domainXML []byte
}

// loadTrialInputs parses the embedded inputs once.
var loadTrialInputs = sync.OnceValues(func() (*trialInputs, error) {
	in := &trialInputs{objects: map[string][]manifest.Object{}}
	err := fs.WalkDir(trialFiles, "testdata/trial", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := trialFiles.ReadFile(p)
		if err != nil {
			return err
		}
		objs, err := manifest.Parse(p, bytes.NewReader(raw))
		if err != nil {
			return err
		}
		dir := path.Base(path.Dir(p))
		in.objects[dir] = append(in.objects[dir], objs...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read trial inputs: %w", err)
	}
	raw, err := trialFiles.ReadFile("testdata/vmdefaults-vm.json")
	if err != nil {
		return nil, fmt.Errorf("read trial inputs: %w", err)
	}
	if err := json.Unmarshal(raw, &in.vm); err != nil {
		return nil, fmt.Errorf("read trial inputs: testdata/vmdefaults-vm.json: %w", err)
	}
	if in.domainXML, err = trialFiles.ReadFile("testdata/vmdefaults-domain.xml"); err != nil {
		return nil, fmt.Errorf("read trial inputs: %w", err)
	}
	return in, nil
})

// find returns the objects of kind in example dir, the one named namespace/name first when
// name is given; an error when there is none, since the inputs are part of the binary.
func (in *trialInputs) find(dir, kind, namespace, name string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, o := range in.objects[dir] {
		if o.GetKind() != kind {
			continue
		}
		if name != "" && (o.GetName() != name || o.GetNamespace() != namespace) {
			continue
		}
		out = append(out, o.Unstructured)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trial input %s %s/%s not found in %s", kind, namespace, name, dir)
	}
	return out, nil
}

func (in *trialInputs) one(dir, kind, namespace, name string) (*unstructured.Unstructured, error) {
	objs, err := in.find(dir, kind, namespace, name)
	if err != nil {
		return nil, err
	}
	return objs[0], nil
}

// trialCases are the trial's decisions: every entrypoint the engine serves is evaluated by
// at least one (TestTrialEvaluatesEveryEntrypoint).
var trialCases = []trialCase{{
	decision: "migration.policy",
	input:    "VMI hpc/fedora-gpu of examples/migration-policy",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		set, subject, err := trialPolicySet(e, in)
		if err != nil {
			return err
		}
		if _, err := set.Decide(ctx, subject); err != nil {
			return err
		}
		_, err = set.Explain(ctx, subject)
		return err
	},
}, {
	decision: "migration.policy.validation",
	input:    "MigrationPolicy tuned-bandwidth of examples/migration-policy",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		policies, err := in.find("migration-policy", "MigrationPolicy", "", "")
		if err != nil {
			return err
		}
		policy, err := in.one("migration-policy", "MigrationPolicy", "", "tuned-bandwidth")
		if err != nil {
			return err
		}
		_, err = e.ValidateMigrationPolicyIn(ctx, policy, e.ExistingMigrationPolicies(policies))
		return err
	},
}, {
	decision: "migration.target",
	input:    "VirtualMachineInstanceMigration prod/to-node-2 of examples/migration-target",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		migration, err := in.one("migration-target", "VirtualMachineInstanceMigration", "prod", "to-node-2")
		if err != nil {
			return err
		}
		vmi, err := in.one("migration-target", "VirtualMachineInstance", "prod", "db")
		if err != nil {
			return err
		}
		pods, _ := in.find("migration-target", "Pod", "", "")
		nodes, err := trialNodes(e, in, "migration-target")
		if err != nil {
			return err
		}
		target := MigrationTargetInput{Migration: migration, VMI: vmi, SourcePod: SourceLauncherPod(vmi, pods), Nodes: nodes, Pods: pods}
		if _, err := e.MigrationTarget(ctx, target); err != nil {
			return err
		}
		if _, err := e.ExplainMigrationTarget(ctx, target); err != nil {
			return err
		}
		if _, err := e.ValidateMigration(ctx, migration); err != nil {
			return err
		}
		_, err = e.MigrationTargetPodAffinity(ctx, migration, nil)
		return err
	},
}, {
	decision: "migration.drain",
	input:    "draining node-a of examples/drain",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		vmis, err := in.find("drain", "VirtualMachineInstance", "", "")
		if err != nil {
			return err
		}
		kubevirt, err := in.one("drain", "KubeVirt", "kubevirt", "kubevirt")
		if err != nil {
			return err
		}
		nodes, err := trialNodes(e, in, "drain")
		if err != nil {
			return err
		}
		_, err = e.Drain(ctx, DrainInput{Drain: []string{"node-a"}, VMIs: vmis, Nodes: nodes, KubeVirt: kubevirt})
		if errors.Is(err, ErrMissingDecision) {
			return nil // optional: a bundle built before the drain preview serves the rest
		}
		return err
	},
}, {
	decision: "node.migratability",
	input:    "the nodes and VMI default/new-db of examples/migratability",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		nodes, err := trialNodes(e, in, "migratability")
		if err != nil {
			return err
		}
		if _, err := nodes.Migratability(ctx); err != nil {
			return err
		}
		vmi, err := in.one("migratability", "VirtualMachineInstance", "default", "new-db")
		if err != nil {
			return err
		}
		kubevirt, err := in.one("migratability", "KubeVirt", "kubevirt", "kubevirt")
		if err != nil {
			return err
		}
		_, err = e.SchedulingAffinity(ctx, vmi, kubevirt)
		return err
	},
}, {
	decision: "node.baseline",
	input:    "the nodes of examples/cpu-baseline",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		nodes, err := trialNodes(e, in, "cpu-baseline")
		if err != nil {
			return err
		}
		_, err = nodes.CPUBaseline(ctx, "topology.kubernetes.io/zone")
		if errors.Is(err, ErrMissingDecision) {
			return nil // optional: a bundle built before the CPU baseline serves the rest
		}
		return err
	},
}, {
	decision: "pool.plan",
	input:    "VirtualMachinePool naming/my-vm of examples/pool",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		pool, err := in.one("pool", "VirtualMachinePool", "naming", "my-vm")
		if err != nil {
			return err
		}
		vms, err := in.find("pool", "VirtualMachine", "", "")
		if err != nil {
			return err
		}
		vmis, err := in.find("pool", "VirtualMachineInstance", "", "")
		if err != nil {
			return err
		}
		_, err = e.PoolPlan(ctx, PoolInput{Pool: pool, VMs: vms, VMIs: vmis, Now: trialNow})
		return err
	},
}, {
	decision: "vm.defaults",
	input:    "the VM and libvirt domain of engine/testdata/vmdefaults-*",
	run: func(ctx context.Context, e *Engine, in *trialInputs) error {
		object, spec := in.vm.Object, in.vm.Spec
		plan, err := e.PlanVMDefaults(ctx, object, spec, Machines{"amd64": {"q35", "pc"}})
		if err != nil {
			return err
		}
		if _, err := e.VMShape(ctx, object, spec, ""); err != nil && !errors.Is(err, ErrMissingDecision) {
			return err
		}
		if len(plan.Errors) > 0 {
			return nil // the bundle calls the VM invalid: an answer, with nothing to map
		}
		_, err = e.VMDefaults(ctx, plan, in.domainXML)
		return err
	},
}}

// trialNow is the time pool plans of the trial are made for, fixed so a trial is the same
// every time.
var trialNow = time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)

func trialPolicySet(e *Engine, in *trialInputs) (*MigrationPolicies, MigrationPolicySubject, error) {
	var subject MigrationPolicySubject
	policies, err := in.find("migration-policy", "MigrationPolicy", "", "")
	if err != nil {
		return nil, subject, err
	}
	kubevirt, err := in.one("migration-policy", "KubeVirt", "kubevirt", "kubevirt")
	if err != nil {
		return nil, subject, err
	}
	vmi, err := in.one("migration-policy", "VirtualMachineInstance", "hpc", "fedora-gpu")
	if err != nil {
		return nil, subject, err
	}
	ns, err := in.one("migration-policy", "Namespace", "", "hpc")
	if err != nil {
		return nil, subject, err
	}
	set, err := e.MigrationPolicies(policies, kubevirt)
	if err != nil {
		return nil, subject, err
	}
	subject = MigrationPolicySubject{Namespace: vmi.GetNamespace(), Name: vmi.GetName(), Labels: vmi.GetLabels(), NamespaceLabels: ns.GetLabels()}
	return set, subject, nil
}

func trialNodes(e *Engine, in *trialInputs, dir string) (*Nodes, error) {
	objs, err := in.find(dir, "Node", "", "")
	if err != nil {
		return nil, err
	}
	nodes := e.NewNodes()
	for _, o := range objs {
		if err := nodes.Upsert(o); err != nil {
			return nil, err
		}
	}
	return nodes, nil
}

// trial decides every trial case on g with the trial budget, before g is activated. It
// returns a *BundleError naming the decision, its input and the budget it broke.
func (e *Engine) trial(ctx context.Context, g *generation) error {
	in, err := loadTrialInputs()
	if err != nil {
		return refused(g.source, ReasonTrial, "trial", err)
	}
	// The shadow logs nothing: its decisions are the trial's, reported below.
	shadow := &Engine{log: slog.New(slog.DiscardHandler), fileLimit: e.fileLimit}
	served := g.budget
	g.budget = &budgetPolicy{Budget: e.trialBudget}
	defer func() { g.budget = served }()
	shadow.active.Store(g)
	for _, c := range trialCases {
		start := time.Now()
		err := c.run(ctx, shadow, in)
		e.log.DebugContext(ctx, "trial decision", "decision", c.decision, "source", g.source, "duration", time.Since(start), "error", err)
		if err == nil || errors.Is(err, ErrMalformedInput) {
			continue
		}
		if ctx.Err() != nil {
			return fmt.Errorf("trial %s: %w", c.decision, ctx.Err())
		}
		reason := ReasonTrial
		if errors.Is(err, ErrBudgetExceeded) {
			reason = ReasonBudget
		}
		return refused(g.source, reason, fmt.Sprintf("trial %s on %s", c.decision, c.input), err)
	}
	return nil
}

// trialDecisions are the decisions the trial decides, for documentation and tests.
func trialDecisions() []string {
	out := make([]string, len(trialCases))
	for i, c := range trialCases {
		out[i] = c.decision
	}
	return slices.Clip(out)
}
