package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/defaults"
	"github.com/virt-rules/virt-rules/engine"
	"github.com/virt-rules/virt-rules/internal/bundlestatus"
	"github.com/virt-rules/virt-rules/internal/manifest"
)

// defaultLibvirtRoot is where `defaulter` keeps its libvirt: tmpfs, one directory per service.
const defaultLibvirtRoot = "/dev/shm/virt-rules-defaults"

func newDefaulterCommand() *cobra.Command {
	var (
		b         bundleFlags
		listen    string
		root      string
		logLevel  string
		cacheSize int
		shapeSize int
		kubevirt  string
		sec       defaulterSecurity
		candidate defaulterCandidate
	)
	cmd := &cobra.Command{
		Use:   "defaulter",
		Short: "Serve VM defaults over HTTP: every guest-visible value libvirt would choose, ahead of time",
		Long: `defaulter serves the vm.defaults decision (seed 004) over HTTP. It needs libvirt (a binary
built with -tags libvirt, libvirt's QEMU driver and qemu-system installed).

  POST /apis/vms/defaults              a VirtualMachine or VirtualMachineInstance (JSON) in, the
                                       whole object with every guest-visible default filled in out
  POST /apis/vms/defaults?dryRun=true  the same, but only the RFC 6902 JSON patch that defaults it
  GET  /healthz                        the process is alive
  GET  /readyz                         libvirt's capabilities are probed and cached
  GET  /metrics                        Prometheus metrics, virtrules_defaults_request_duration_seconds,
                                       virtrules_bundle_* and virtrules_decision_budget_exceeded_total

The body is the object itself, or a DefaultsRequest (apiVersion defaults.virt-rules.io/v1alpha1:
object, kubevirt, namespaceUID, request, instancetype, preference), which the admission webhook
sends with the cluster's live KubeVirt CR, the namespace's UID and, for a VirtualMachine, the
instancetype and preference it refers to ({kind, name, revision, spec}: the service reads no
cluster). Without a KubeVirt CR in the request, objects are
defaulted for the one in --kubevirt FILE, or for KubeVirt's built-in configuration. What is
left to the node (host devices: SR-IOV VFs, GPUs, ...) comes back as Warning headers.

It serves HTTPS (--tls-cert-file, --tls-private-key-file, reloaded when they change; while
they do not hold a certificate yet, e.g. a Secret volume the controller has not filled in, a
throwaway self-signed one, /readyz answering 503 until they do) and
answers only callers the API server vouches for: the bearer token must be a service account
token for --token-audience (a TokenReview), and the caller must be allowed the method on the
path (a SubjectAccessReview: nonResourceURLs [/apis/vms/defaults] verbs [post], [/metrics]
[get]); examples/deploy/defaults/rbac.yaml allows only virt-rules' controller. 401 without a
valid token, 403 for any other caller. /healthz and /readyz need nothing (the kubelet's
probes). The reviews go to the API server of --kubeconfig, or the in-cluster one, as the
defaulter's own service account (system:auth-delegator). --insecure-http serves plain HTTP to
anyone instead: for local use only.

Errors are Kubernetes Status objects: 400 not a VM, 422 an invalid or unsupported field (each
field in details.causes, libvirt's message when libvirt refused), 503 libvirt unreachable.

libvirt runs inside this process (qemu:///embed) rooted at --libvirt-root, best on tmpfs; one
process per root. Domains left behind by a crash are undefined at start.

libvirt's answers are kept (--libvirt-cache-size of them, least recently used go first) by the
domain asked with each VM's own MACs, name and UUID normalized: VMs of one shape, such as many
VMs of one template, are defined once. The cache empties itself when libvirt's capabilities
change; virtrules_defaults_libvirt_cache_requests_total counts hits and misses.

On top of that, the defaults of --shape-cache-size shapes are kept. The rules say what a shape
is (vm.defaults.shape): the spec as far as they read it (not what volumes and networks point
at: claims, images, cloud-init data) and the values an object's identity gives (firmware UUID
and MACs). VMs of one template get one shape's defaults with their own UUID and MACs put in,
at the cost of that small decision. A bundle without vm.defaults.shape has every object
evaluated in full; virtrules_defaults_shape_cache_requests_total counts hits and misses.

Shadow rollout: --candidate-bundle PATH or --candidate-bundle-url URL (polled every
--candidate-bundle-poll-interval; http:// only with --candidate-bundle-allow-http; verified
with --candidate-bundle-verification-key, default --bundle-verification-key) is asked every
answer again once it is decided, in the background (--candidate-max-in-flight at once, 10,000
waiting, beyond that not compared), with the same libvirt and never acted on. Where its patch,
warnings or refusal differ is counted in
virtrules_candidate_decision_differences_total{decision="vm.defaults.defaults"} (every
comparison in virtrules_candidate_decision_comparisons_total) and logged; its activations and
refusals in virtrules_candidate_bundle_*.`,
		Example: `  virt-rules defaulter --listen :8090 --tls-cert-file tls.crt --tls-private-key-file tls.key
  virt-rules defaulter --listen 127.0.0.1:8090 --insecure-http   # local use only
  curl -s -XPOST --data-binary @vm.json 'localhost:8090/apis/vms/defaults?dryRun=true'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ran, err := runAsInit(); ran {
				return err
			}
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			cluster, err := readCluster(kubevirt, cmd.InOrStdin())
			if err != nil {
				return err
			}
			return runDefaulter(cmd.Context(), b, listen, root, cacheSize, shapeSize, cluster, sec, candidate, logger)
		},
	}
	b.register(cmd)
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":8090", "`ADDRESS` of the HTTP service")
	f.StringVar(&root, "libvirt-root", defaultLibvirtRoot, "`DIR` of the embedded libvirt's state (tmpfs is fastest)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.IntVar(&cacheSize, "libvirt-cache-size", defaults.DefaultCacheSize, "keep up to `N` of libvirt's answers for VMs of the same shape (0: ask libvirt for every request)")
	f.IntVar(&shapeSize, "shape-cache-size", defaults.DefaultCacheSize, "keep the defaults of up to `N` shapes of VM, on top of libvirt's answers (0: evaluate every VM in full)")
	f.StringVar(&kubevirt, "kubevirt", "", kubevirtFlagUsage)
	sec.register(cmd)
	candidate.register(cmd)
	return cmd
}

// defaulterCandidate are the defaulter's flags for a shadow rollout: the controller's, and
// what the controller takes from its --bundle-url flags.
type defaulterCandidate struct {
	candidateBundleFlags
	allowHTTP bool
	poll      time.Duration
}

func (f *defaulterCandidate) register(cmd *cobra.Command) {
	f.candidateBundleFlags.register(cmd)
	cmd.Flags().BoolVar(&f.allowHTTP, "candidate-bundle-allow-http", false, "accept an http:// --candidate-bundle-url")
	cmd.Flags().DurationVar(&f.poll, "candidate-bundle-poll-interval", 10*time.Second, "how often to check --candidate-bundle for changes, or --candidate-bundle-url (whole seconds)")
}

// maxInputFlag registers --max-input-bytes into max.
func maxInputFlag(cmd *cobra.Command, max *int64) {
	cmd.Flags().Int64Var(max, "max-input-bytes", manifest.DefaultMaxBytes, "read at most `N` bytes of all manifests together (regular files and stdin only)")
}

const kubevirtFlagUsage = "default for the cluster of the KubeVirt CR in `FILE` (its spec.configuration: machine type, CPU model, default interface, ...; - for stdin); default: KubeVirt's built-in configuration"

// readCluster reads the KubeVirt CR in path ("" for none: KubeVirt's built-in configuration).
func readCluster(path string, stdin io.Reader) (*engine.VMCluster, error) {
	if path == "" {
		return nil, nil
	}
	objs, err := manifest.Read([]string{path}, stdin)
	if err != nil {
		return nil, fmt.Errorf("--kubevirt: %w", err)
	}
	var found []manifest.Object
	for _, o := range objs {
		if o.GetAPIVersion() == "kubevirt.io/v1" && o.GetKind() == "KubeVirt" {
			found = append(found, o)
		} else {
			return nil, fmt.Errorf("--kubevirt: %s: %s: want a kubevirt.io/v1 KubeVirt", o.Position(), o.Describe())
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("--kubevirt %s: want one KubeVirt CR, found %d", path, len(found))
	}
	c, err := engine.NewVMCluster(found[0].Object)
	if err != nil {
		return nil, fmt.Errorf("--kubevirt: %s: %w", found[0].Position(), err)
	}
	return c, nil
}

func runDefaulter(ctx context.Context, b bundleFlags, listen, root string, cacheSize, shapeSize int, cluster *engine.VMCluster, sec defaulterSecurity,
	candidate defaulterCandidate, logger *slog.Logger) error {
	if cacheSize < 0 {
		return fmt.Errorf("--libvirt-cache-size %d: want 0 or more", cacheSize)
	}
	if shapeSize < 0 {
		return fmt.Errorf("--shape-cache-size %d: want 0 or more", shapeSize)
	}
	svcOpts, tlsConfig, err := sec.setUp(ctx, logger)
	if err != nil {
		return err
	}
	// The bundle's metrics (which bundle serves, refusals, decisions over their budget) beside
	// the service's, as the controller exports them.
	reg := prometheus.NewRegistry()
	status, err := bundlestatus.New(reg)
	if err != nil {
		return fmt.Errorf("bundle metrics: %w", err)
	}
	eng, err := engine.New(ctx, append(b.options(), engine.WithLogger(logger),
		engine.WithBundleEvents(status.Observe), engine.WithBudgetEvents(status.ObserveBudget))...)
	if err != nil {
		return err
	}
	svcOpts = append(svcOpts, defaults.WithRegistry(reg), defaults.WithCacheSize(cacheSize),
		defaults.WithShapeCacheSize(shapeSize), defaults.WithCluster(cluster))
	// A shadow rollout: the candidate's metrics on the same registry; no decision log here.
	bounds := candidateBounds{bundle: b, remote: remoteBundleFlags{allowHTTP: candidate.allowHTTP, revertErrors: engine.DefaultRevertErrors,
		revertWindow: engine.DefaultRevertWindow}, poll: candidate.poll}
	shadowed, err := candidate.shadow(ctx, eng, bounds, logger, nil, reg)
	if err != nil {
		return err
	}
	if shadowed != nil {
		go func() { _ = shadowed.Start(ctx) }()
		svcOpts = append(svcOpts, defaults.WithShadow(shadowed.Shadow))
	}
	svc := defaults.NewService(eng, logger, svcOpts...)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", listen, err)
	}
	// A request is one object of at most defaults.MaxBodyBytes, answered within the admission
	// webhook's seconds: slow bodies, slow readers and idle connections are not held.
	srv := &http.Server{
		Handler:           svc,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		TLSConfig:         tlsConfig,
	}
	served := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			served <- srv.ServeTLS(ln, "", "")
		} else {
			served <- srv.Serve(ln)
		}
	}()
	logger.InfoContext(ctx, "serving", "address", ln.Addr().String(), "tls", tlsConfig != nil, "bundleRevision", eng.Revision())

	// Not ready until libvirt answers. A driver that fails to start is fatal, not retried:
	// qemu:///embed runs libvirt's QEMU driver in this process, and what makes it fail (no
	// QEMU binary, a root it cannot use or that another process holds, a capability probe
	// that fails) does not heal in this process. Exiting lets the kubelet restart the pod
	// with its back-off, and shows the failure in the pod's status rather than in a /readyz
	// that stays 503.
	lv, err := defaults.OpenLibvirt(ctx, root, logger)
	if err != nil {
		srv.Close()
		if ctx.Err() != nil {
			return nil // stopped while the driver started
		}
		logger.ErrorContext(ctx, "libvirt's QEMU driver failed to start", "libvirtRoot", root, "error", err)
		return fmt.Errorf("start libvirt's QEMU driver (--libvirt-root %s): %w", root, err)
	}
	defer lv.Close()
	svc.SetHypervisor(lv)
	select {
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return srv.Shutdown(shutdown)
	case err := <-served:
		return err
	}
}

func newDefaultCommand() *cobra.Command {
	var (
		b        bundleFlags
		files    []string
		output   string
		patch    bool
		root     string
		kubevirt string
		maxInput int64
	)
	cmd := &cobra.Command{
		Use:   "default -f FILE...",
		Short: "Fill in a VM's guest-visible defaults offline, in-process (needs libvirt, no service)",
		Long: `default reads VirtualMachines and VirtualMachineInstances from manifests (-f, several
documents per file, - for stdin) and prints each with every guest-visible value libvirt would
choose filled in, as the defaulter service and the admission webhook would: machine type, NIC
model, MAC and PCI addresses, disk buses, CPU topology, guest memory, firmware UUID, ...
Fields already set are kept. It starts libvirt's QEMU driver in this process (a few seconds
the first time, to probe QEMU) in a throwaway directory.

The guest is the one KubeVirt would build for the cluster of --kubevirt FILE (a KubeVirt CR:
machine type, CPU model, default interface, ... from its spec.configuration), or for KubeVirt's
built-in configuration. The firmware UUID and MACs derive from each object's namespace and
name; the admission webhook derives them from the namespace's UID instead, so that the same
namespace/name in two clusters differ: offline output then differs from the cluster's in
those values only. What is left to the node (host devices: SR-IOV VFs, GPUs, ...) is named
in a warning on stderr.

A VirtualMachine with spec.instancetype or spec.preference is defaulted as KubeVirt builds its
guest: the instancetype and preference (instancetype.kubevirt.io/v1beta1 objects, or the
apps/v1 ControllerRevision of spec.*.revisionName) must be among the inputs. They are
printed as they are; the VM gets only what neither states, and a warning per reference names
what is left to it. A missing one, or a VM setting what its instancetype sets, is an error
naming the field.`,
		Example: `  virt-rules default -f examples/defaults/vm.yaml
  virt-rules default --patch -o json -f vm.yaml
  virt-rules default -f instancetypes.yaml -f vm.yaml`,
		Args: withStatus(2, cobra.NoArgs),
		RunE: withStatus(2, func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return errors.New("-f: name at least one manifest")
			}
			if output != "yaml" && output != "json" {
				return fmt.Errorf("-o %s: want yaml or json", output)
			}
			objs, err := manifest.ReadLimited(files, cmd.InOrStdin(), maxInput)
			unreadable, err := manifest.Errors(err)
			if err != nil {
				return err
			}
			if len(objs) == 0 && len(unreadable) == 0 {
				return fmt.Errorf("no objects in %s: nothing to default", strings.Join(files, ", "))
			}
			cluster, err := readCluster(kubevirt, cmd.InOrStdin())
			if err != nil {
				return err
			}
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			eng, err := engine.New(cmd.Context(), append(b.options(), engine.WithLogger(logger))...)
			if err != nil {
				return err
			}
			dir := root
			if dir == "" {
				if dir, err = os.MkdirTemp(defaults.TmpfsDir(), "virt-rules-default-"); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
			}
			lv, err := defaults.OpenLibvirt(cmd.Context(), dir, logger)
			if err != nil {
				return err
			}
			defer lv.Close()
			d := &defaults.Defaulter{Engine: eng, Hypervisor: lv, Cluster: cluster}
			inError, err := defaultObjects(cmd.Context(), d, objs, output, patch, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			errs := append(unreadable, inError...)
			manifest.SortErrors(errs)
			return objectErrors(cmd.ErrOrStderr(), errs)
		}),
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &statusError{status: 2, err: err} })
	b.register(cmd)
	f := cmd.Flags()
	f.StringArrayVarP(&files, "filename", "f", nil, "`FILE` (or directory, or - for stdin) with VMs or VMIs; repeatable")
	f.StringVarP(&output, "output", "o", "yaml", "yaml or json")
	f.BoolVar(&patch, "patch", false, "print only the JSON patch that defaults each object")
	f.StringVar(&root, "libvirt-root", "", "`DIR` of the embedded libvirt's state (default: a new directory on tmpfs, removed afterwards)")
	f.StringVar(&kubevirt, "kubevirt", "", kubevirtFlagUsage)
	maxInputFlag(cmd, &maxInput)
	return cmd
}

// defaultObjects prints every object of objs defaulted, in order. An object that cannot be
// defaulted is one of the errors returned, located and named, and the others are printed all
// the same; the error is for output that cannot be written.
func defaultObjects(ctx context.Context, d *defaults.Defaulter, objs []manifest.Object, output string, patch bool, out, warn io.Writer) ([]*manifest.Error, error) {
	var errs []*manifest.Error
	first := true
	// The instancetypes and preferences (and ControllerRevisions of them) among the inputs are
	// what the VMs refer to: they have nothing to default and are printed as they are.
	refs := defaults.Objects{}
	isRef := map[int]bool{}
	for i, o := range objs {
		isRef[i] = refs.Add(o.Object)
	}
	finder := *d
	finder.Finder = refs
	d = &finder
	for i, o := range objs {
		if isRef[i] {
			raw, err := o.MarshalJSON()
			if err != nil {
				errs = append(errs, o.Error(manifest.ReasonUnreadable, "", "%v", err))
				continue
			}
			var v any = json.RawMessage(raw)
			if patch {
				v = []any{}
			}
			if err := printObject(out, v, output, first); err != nil {
				return nil, err
			}
			first = false
			continue
		}
		if k := o.GetKind(); k != "VirtualMachine" && k != "VirtualMachineInstance" {
			errs = append(errs, o.Error(manifest.ReasonInvalid, "kind", "only VirtualMachines and VirtualMachineInstances are defaulted"))
			continue
		}
		raw, err := o.MarshalJSON()
		if err != nil {
			errs = append(errs, o.Error(manifest.ReasonUnreadable, "", "%v", err))
			continue
		}
		res, err := d.Default(ctx, raw)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%s: %w", o.Describe(), err)
			}
			// Each field at fault at its own line; libvirt's refusal, or any other failure, as
			// the object's.
			if ie := (*defaults.InvalidError)(nil); errors.As(err, &ie) && len(ie.Causes) > 0 {
				for _, c := range ie.Causes {
					errs = append(errs, o.Error(manifest.ReasonInvalid, c.Field, "%s", c.Message))
				}
				continue
			}
			errs = append(errs, o.Error(manifest.ReasonDecisionFailed, "", "%v", err))
			continue
		}
		for _, text := range res.Warnings {
			fmt.Fprintf(warn, "Warning: %s: %s: %s\n", o.Position(), o.Describe(), text)
		}
		var v any = json.RawMessage(res.Object)
		if patch {
			v = res.Patch
		}
		if err := printObject(out, v, output, first); err != nil {
			return nil, err
		}
		first = false
	}
	return errs, nil
}

// printObject prints v, an object or a patch, as output (yaml or json); YAML documents after
// the first are separated.
func printObject(out io.Writer, v any, output string, first bool) error {
	var text []byte
	var err error
	if output == "json" {
		text, err = json.MarshalIndent(v, "", "  ")
		text = append(text, '\n')
	} else {
		var j []byte
		if j, err = json.Marshal(v); err == nil {
			text, err = yaml.JSONToYAML(j)
		}
		if !first {
			text = append([]byte("---\n"), text...)
		}
	}
	if err != nil {
		return err
	}
	_, err = out.Write(text)
	return err
}
