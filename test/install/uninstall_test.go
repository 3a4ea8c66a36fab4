package install_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/kube"
	"helm.sh/helm/v3/pkg/release"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// helmNamespace is the Helm release's namespace, apart from the kubectl kit's.
const helmNamespace = "virt-rules-helm"

// helmWebhookConfigurations are the webhook configurations the chart installs with the
// defaulter, as the watches name them.
var helmWebhookConfigurations = []string{
	"ValidatingWebhookConfiguration virt-rules-validating",
	"MutatingWebhookConfiguration virt-rules-mutating",
	"MutatingWebhookConfiguration zz-virt-rules-defaults",
}

// helmControllerObjects are what the webhooks point at, and what runs them.
var helmControllerObjects = []string{
	"Deployment virt-rules", "Service virt-rules-webhook",
	"Deployment virt-rules-defaulter", "Service virt-rules-defaulter",
}

var _ = Describe("helm install and helm uninstall of charts/virt-rules, with Helm's Go SDK", Ordered, func() {
	var values = map[string]any{
		"image":     map[string]any{"repository": "virt-rules/controller", "tag": "helm-test"},
		"defaulter": map[string]any{"enabled": true},
	}
	BeforeAll(func(sctx SpecContext) { startCluster(sctx) }, NodeTimeout(30*time.Minute))

	// installForHook installs the chart with values and records deletions from then on, with
	// node-1 cordoned until the spec ends: the hook Job's pod must not reach node-1, whose
	// kubelet is kwok (kwok would report it Succeeded without running anything). Cordoned, the
	// node takes no new pod; the spec plays the hook pod's kubelet (playHookPod).
	installForHook := func(sctx SpecContext) (*action.Configuration, *deletions) {
		GinkgoHelper()
		cfg := helmConfiguration(helmNamespace)
		helmInstall(sctx, cfg, values)
		setUnschedulable("node-1", true)
		DeferCleanup(setUnschedulable, "node-1", false)
		return cfg, recordDeletions(sctx)
	}

	It("removes every webhook configuration in its pre-delete hook, before the Deployments and Services", func(sctx SpecContext) {
		cfg, rec := installForHook(sctx)
		hook := make(chan hookRun, 1)
		go func() {
			defer GinkgoRecover()
			var run hookRun
			defer func() { hook <- run }()
			run = playHookPod(sctx, rec)
		}()

		uninstall := action.NewUninstall(cfg)
		uninstall.Timeout = 3 * time.Minute
		_, err := uninstall.Run("virt-rules")
		Expect(err).NotTo(HaveOccurred())
		var run hookRun
		Eventually(hook).Should(Receive(&run))
		Expect(run.exitCode).To(Equal(0), run.output)
		for _, c := range helmWebhookConfigurations {
			name := strings.Fields(c)[1]
			Expect(run.output).To(MatchRegexp(`"msg":"webhook configuration deleted","kind":"[a-z]+","name":"%s"`, name))
		}

		Eventually(rec.seen).Should(ContainElements(helmControllerObjects))
		order := rec.seen()
		AddReportEntry("helm uninstall: what disappeared, in order", strings.Join(order, "\n"))
		started, finished := slices.Index(order, "hook pod started"), slices.Index(order, "hook pod finished")
		for _, c := range helmWebhookConfigurations {
			Expect(slices.Index(order, c)).To(BeNumerically(">", started), "%s deleted by the hook: %v", c, order)
			Expect(slices.Index(order, c)).To(BeNumerically("<", finished), "%s deleted by the hook: %v", c, order)
			for _, o := range helmControllerObjects {
				Expect(slices.Index(order, c)).To(BeNumerically("<", slices.Index(order, o)), "%s gone before %s: %v", c, o, order)
			}
		}

		By("leaving none of the hook's objects: hook-succeeded deletes them")
		for _, o := range []client.Object{
			&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: helmNamespace, Name: "virt-rules-uninstall"}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: helmNamespace, Name: "virt-rules-uninstall"}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-uninstall"}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-uninstall"}},
		} {
			Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(o), o)) }).Should(BeTrue(), "%T %s", o, o.GetName())
		}
	}, SpecTimeout(10*time.Minute))

	It("without the hook (helm uninstall --no-hooks), deletes the webhook configurations after the Deployments and Services", func(sctx SpecContext) {
		cfg := helmConfiguration(helmNamespace)
		helmInstall(sctx, cfg, values)
		rec := recordDeletions(sctx)
		uninstall := action.NewUninstall(cfg)
		uninstall.DisableHooks = true
		uninstall.Timeout = 3 * time.Minute
		_, err := uninstall.Run("virt-rules")
		Expect(err).NotTo(HaveOccurred())
		Eventually(rec.seen).Should(ContainElements(append(slices.Clone(helmWebhookConfigurations), helmControllerObjects...)))
		order := rec.seen()
		AddReportEntry("helm uninstall --no-hooks: what disappeared, in order", strings.Join(order, "\n"))
		for _, c := range helmWebhookConfigurations {
			for _, o := range helmControllerObjects {
				Expect(slices.Index(order, c)).To(BeNumerically(">", slices.Index(order, o)), "Helm's own order: %s after %s: %v", c, o, order)
			}
		}
	}, SpecTimeout(10*time.Minute))

	It("stops when the hook fails: helm uninstall returns the Job's failure and deletes nothing else", func(sctx SpecContext) {
		cfg, rec := installForHook(sctx)
		failed := make(chan int, 1)
		pctx, stopPlaying := context.WithCancel(sctx)
		go func() {
			defer GinkgoRecover()
			failed <- failHookPods(pctx)
		}()

		uninstall := action.NewUninstall(cfg)
		uninstall.Timeout = 3 * time.Minute
		_, err := uninstall.Run("virt-rules")
		stopPlaying()
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("virt-rules-uninstall"))
		Expect(err.Error()).To(ContainSubstring("BackoffLimitExceeded"))
		Expect(<-failed).To(Equal(3), "tried three times (backoffLimit 2)")
		AddReportEntry("helm uninstall with a failing hook", err.Error())

		By("leaving every object of the release, the webhook configurations and what they point at")
		Expect(rec.seen()).To(BeEmpty())
		Expect(k8s.Get(sctx, client.ObjectKey{Name: "virt-rules-validating"}, &admissionregistrationv1.ValidatingWebhookConfiguration{})).To(Succeed())
		for _, name := range []string{"virt-rules-mutating", "zz-virt-rules-defaults"} {
			Expect(k8s.Get(sctx, client.ObjectKey{Name: name}, &admissionregistrationv1.MutatingWebhookConfiguration{})).To(Succeed(), name)
		}
		for _, name := range []string{"virt-rules", "virt-rules-defaulter"} {
			Expect(k8s.Get(sctx, client.ObjectKey{Namespace: helmNamespace, Name: name}, &appsv1.Deployment{})).To(Succeed(), name)
		}
		for _, name := range []string{"virt-rules-webhook", "virt-rules-defaulter"} {
			Expect(k8s.Get(sctx, client.ObjectKey{Namespace: helmNamespace, Name: name}, &corev1.Service{})).To(Succeed(), name)
		}
		Expect(k8s.Get(sctx, client.ObjectKey{Namespace: helmNamespace, Name: "virt-rules-uninstall"}, &batchv1.Job{})).To(Succeed(), "a failed hook is kept, to be read")

		By("removing it without the hook, as the README says when the Job cannot run")
		uninstall = action.NewUninstall(cfg)
		uninstall.DisableHooks = true
		uninstall.Timeout = 3 * time.Minute
		_, err = uninstall.Run("virt-rules")
		Expect(err).NotTo(HaveOccurred())
		for _, o := range []client.Object{
			&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: helmNamespace, Name: "virt-rules-uninstall"}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: helmNamespace, Name: "virt-rules-uninstall"}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-uninstall"}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "virt-rules-uninstall"}},
		} {
			Expect(client.IgnoreNotFound(k8s.Delete(sctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)))).To(Succeed())
		}
	}, SpecTimeout(10*time.Minute))
})

// failHookPods is the kubelet of the hook Job's pods when the hook fails: it reports each pod
// the job controller makes Failed (its container exited 1) through pods/status, until ctx
// ends, and returns how many it failed.
func failHookPods(ctx context.Context) int {
	failed := map[string]bool{}
	for ctx.Err() == nil {
		pods := &corev1.PodList{}
		if err := k8s.List(ctx, pods, client.InNamespace(helmNamespace), client.MatchingLabels{batchv1.JobNameLabel: "virt-rules-uninstall"}); err == nil {
			for i := range pods.Items {
				pod := &pods.Items[i]
				if failed[pod.Name] || pod.Status.Phase != corev1.PodPending {
					continue
				}
				now := metav1.Now()
				pod.Status.Phase = corev1.PodFailed
				pod.Status.StartTime = &now
				pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
					Name: pod.Spec.Containers[0].Name, Image: pod.Spec.Containers[0].Image, ImageID: pod.Spec.Containers[0].Image,
					State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", StartedAt: now, FinishedAt: now}},
				}}
				if err := k8s.Status().Update(ctx, pod); err == nil {
					failed[pod.Name] = true
					fmt.Fprintf(GinkgoWriter, "hook pod %s reported Failed\n", pod.Name)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return len(failed)
}

// helmConfiguration is Helm's action configuration for the test cluster as its admin (the
// kubeconfig of envtest's kube-apiserver), releases kept in Secrets, as the helm CLI does.
func helmConfiguration(namespace string) *action.Configuration {
	GinkgoHelper()
	cfg := &action.Configuration{}
	logf := func(format string, v ...any) { fmt.Fprintf(GinkgoWriter, "helm: "+format+"\n", v...) }
	Expect(cfg.Init(kube.GetConfig(cluster.Kubeconfig, "", namespace), namespace, "secret", logf)).To(Succeed())
	return cfg
}

// helmInstall is `helm install virt-rules charts/virt-rules -n virt-rules-helm
// --create-namespace --set ...`, and checks the webhook configurations are there.
func helmInstall(ctx context.Context, cfg *action.Configuration, values map[string]any) {
	GinkgoHelper()
	chart, err := loader.Load(filepath.Join(repoRoot, "charts", "virt-rules"))
	Expect(err).NotTo(HaveOccurred())
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = "virt-rules", helmNamespace, true
	install.Timeout = 2 * time.Minute
	rel, err := install.RunWithContext(ctx, chart, values)
	Expect(err).NotTo(HaveOccurred())
	var hooks []string
	for _, h := range rel.Hooks {
		Expect(h.Events).To(Equal([]release.HookEvent{release.HookPreDelete}), h.Path)
		hooks = append(hooks, h.Kind+" "+h.Name)
	}
	Expect(hooks).To(ConsistOf("ServiceAccount virt-rules-uninstall", "ClusterRole virt-rules-uninstall",
		"ClusterRoleBinding virt-rules-uninstall", "Job virt-rules-uninstall"))
	Expect(k8s.Get(ctx, client.ObjectKey{Name: "virt-rules-validating"}, &admissionregistrationv1.ValidatingWebhookConfiguration{})).To(Succeed())
	for _, name := range []string{"virt-rules-mutating", "zz-virt-rules-defaults"} {
		Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, &admissionregistrationv1.MutatingWebhookConfiguration{})).To(Succeed())
	}
}

func setUnschedulable(node string, unschedulable bool) {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return err
		}
		n.Spec.Unschedulable = unschedulable
		return k8s.Update(ctx, n)
	})).To(Succeed())
}

// deletions records, in the order the API server reports them, which of the release's
// objects disappear ("KIND NAME"), and the stand-in kubelet's marks.
type deletions struct {
	mu    sync.Mutex
	order []string
}

func (d *deletions) add(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.order = append(d.order, s)
	fmt.Fprintf(GinkgoWriter, "%s %s\n", time.Now().Format("15:04:05.000"), s)
}

func (d *deletions) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.order)
}

// recordDeletions watches both webhook configuration kinds, and the Deployments and Services
// of helmNamespace, from now until the spec ends.
func recordDeletions(sctx SpecContext) *deletions {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(cluster.Config)
	Expect(err).NotTo(HaveOccurred())
	d := &deletions{}
	wctx, stop := context.WithCancel(sctx)
	DeferCleanup(stop)
	for kind, start := range map[string]func(context.Context, metav1.ListOptions) (watch.Interface, error){
		"ValidatingWebhookConfiguration": cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Watch,
		"MutatingWebhookConfiguration":   cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Watch,
		"Deployment":                     cs.AppsV1().Deployments(helmNamespace).Watch,
		"Service":                        cs.CoreV1().Services(helmNamespace).Watch,
	} {
		// From the current state on: a watch without a resourceVersion starts with an ADDED
		// event per object, then reports every change.
		w, err := start(wctx, metav1.ListOptions{})
		Expect(err).NotTo(HaveOccurred(), kind)
		go func() {
			defer w.Stop()
			for e := range w.ResultChan() {
				if e.Type != watch.Deleted {
					continue
				}
				if o, ok := e.Object.(metav1.Object); ok {
					d.add(kind + " " + o.GetName())
				}
			}
		}()
	}
	return d
}

// hookRun is how the hook pod's container ended.
type hookRun struct {
	exitCode int
	output   string
}

// playHookPod is the kubelet of the pod the job controller makes for the pre-delete hook's
// Job: it runs the pod's container, the same virt-rules binary the image's entrypoint is,
// with the pod's arguments, authenticated as the pod's ServiceAccount (a token from the
// TokenRequest API, as the kubelet mounts one: --kubeconfig instead of the in-cluster files),
// then reports the container terminated and the pod Succeeded or Failed through pods/status,
// as a kubelet does. The real job controller then marks the Job Complete, which helm
// uninstall waits for.
func playHookPod(sctx SpecContext, rec *deletions) hookRun {
	GinkgoHelper()
	pod := &corev1.Pod{}
	Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8s.List(sctx, pods, client.InNamespace(helmNamespace), client.MatchingLabels{batchv1.JobNameLabel: "virt-rules-uninstall"})).To(Succeed())
		g.Expect(pods.Items).To(HaveLen(1))
		*pod = pods.Items[0]
	}).WithContext(sctx).WithTimeout(2 * time.Minute).Should(Succeed())
	Expect(pod.Spec.NodeName).To(BeEmpty(), "no kubelet but this one")
	Expect(pod.Spec.ServiceAccountName).To(Equal("virt-rules-uninstall"))
	Expect(pod.Spec.Containers).To(HaveLen(1))
	c := pod.Spec.Containers[0]
	Expect(c.Image).To(Equal("virt-rules/controller:helm-test"), "the controller's image, whose entrypoint is virt-rules")
	Expect(c.Command).To(BeEmpty(), "the image's entrypoint")
	expectOnlyDeleteOfTheNamedConfigurations(sctx, pod.Spec.ServiceAccountName)

	kubeconfig := serviceAccountKubeconfigIn(helmNamespace, pod.Spec.ServiceAccountName)
	cmd := exec.CommandContext(sctx, binary, append(slices.Clone(c.Args), "--kubeconfig", kubeconfig)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	startedAt := metav1.Now()
	rec.add("hook pod started")
	err := cmd.Run()
	rec.add("hook pod finished")
	fmt.Fprintf(GinkgoWriter, "hook pod %s: %v %s\n", pod.Name, c.Args, out.String())
	run := hookRun{output: out.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		run.exitCode = exit.ExitCode()
	} else {
		Expect(err).NotTo(HaveOccurred())
	}

	phase, reason := corev1.PodSucceeded, "Completed"
	if run.exitCode != 0 {
		phase, reason = corev1.PodFailed, "Error"
	}
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(sctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		pod.Status.Phase = phase
		pod.Status.StartTime = &startedAt
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: c.Name, Image: c.Image, ImageID: c.Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: int32(run.exitCode), Reason: reason, StartedAt: startedAt, FinishedAt: metav1.Now(),
			}},
		}}
		return k8s.Status().Update(sctx, pod)
	})).To(Succeed())
	return run
}

// expectOnlyDeleteOfTheNamedConfigurations asks the API server what the hook's ServiceAccount
// may do: delete the chart's webhook configurations, and nothing else asked here.
func expectOnlyDeleteOfTheNamedConfigurations(ctx context.Context, sa string) {
	GinkgoHelper()
	user := "system:serviceaccount:" + helmNamespace + ":" + sa
	can := func(verb, resource, name string) bool {
		r := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + helmNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: "admissionregistration.k8s.io", Resource: resource, Name: name}}}
		Expect(k8s.Create(ctx, r)).To(Succeed())
		return r.Status.Allowed
	}
	for _, c := range helmWebhookConfigurations {
		kind, name, _ := strings.Cut(c, " ")
		resource := strings.ToLower(kind) + "s"
		Expect(can("delete", resource, name)).To(BeTrue(), c)
		Expect(can("update", resource, name)).To(BeFalse(), c)
		Expect(can("get", resource, name)).To(BeFalse(), c)
		Expect(can("delete", resource, "someone-elses")).To(BeFalse(), c)
	}
	Expect(can("list", "mutatingwebhookconfigurations", "")).To(BeFalse())
}
