package scale_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/procfs"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

// scrape reads the controller's /metrics.
func scrape() map[string]*dto.MetricFamily {
	GinkgoHelper()
	resp, err := http.Get(metricsURL)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	Expect(resp.StatusCode).To(Equal(http.StatusOK), "GET %s", metricsURL)
	return clustersuite.ParseMetrics(resp.Body)
}

// scrapeAPIServer reads kube-apiserver's /metrics as the admin.
func scrapeAPIServer() map[string]*dto.MetricFamily {
	GinkgoHelper()
	return clustersuite.APIServerMetrics(ctx, fastCfg)
}

// histogram is a cumulative histogram: counts[i] observations at most bounds[i].
type histogram struct {
	bounds []float64
	counts []float64
	total  float64
}

// histogramOf sums the histograms of name with labels.
func histogramOf(families map[string]*dto.MetricFamily, name string, labels map[string]string) histogram {
	var h histogram
	for _, m := range clustersuite.Series(families, name, labels) {
		hist := m.GetHistogram()
		h.total += float64(hist.GetSampleCount())
		for _, b := range hist.GetBucket() {
			i := slices.Index(h.bounds, b.GetUpperBound())
			if i < 0 {
				h.bounds = append(h.bounds, b.GetUpperBound())
				h.counts = append(h.counts, 0)
				i = len(h.bounds) - 1
			}
			h.counts[i] += float64(b.GetCumulativeCount())
		}
	}
	return h
}

// minus is the observations of h not in earlier (taken from the same series before).
func (h histogram) minus(earlier histogram) histogram {
	out := histogram{bounds: h.bounds, counts: slices.Clone(h.counts), total: h.total - earlier.total}
	for i, b := range h.bounds {
		if j := slices.Index(earlier.bounds, b); j >= 0 {
			out.counts[i] -= earlier.counts[j]
		}
	}
	return out
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile does: linear within the
// bucket it falls in. NaN without observations; +Inf when it falls in the last bucket.
func (h histogram) quantile(q float64) float64 {
	if h.total == 0 {
		return math.NaN()
	}
	rank, lower, below := q*h.total, 0.0, 0.0
	for i, b := range h.bounds {
		if h.counts[i] >= rank {
			if math.IsInf(b, 1) {
				return b
			}
			return lower + (b-lower)*(rank-below)/(h.counts[i]-below)
		}
		lower, below = b, h.counts[i]
	}
	return math.Inf(1)
}

// atMost is the share of observations at most bound, which must be a bucket bound (up to
// rounding: exponential buckets are computed by repeated multiplication).
func (h histogram) atMost(bound float64) float64 {
	for i, b := range h.bounds {
		if math.Abs(b-bound) <= 1e-9*bound && h.total > 0 {
			return h.counts[i] / h.total
		}
	}
	return math.NaN()
}

// reconciles is how many reconciles controller ran, and whether it is idle: nothing queued,
// nothing being reconciled.
func reconciles(controller string) (total float64, idle bool) {
	GinkgoHelper()
	m := scrape()
	total = clustersuite.Counter(m, "controller_runtime_reconcile_total", map[string]string{"controller": controller})
	idle = clustersuite.Counter(m, "workqueue_depth", map[string]string{"name": controller}) == 0 &&
		clustersuite.Counter(m, "controller_runtime_active_workers", map[string]string{"controller": controller}) == 0
	return total, idle
}

// deferredPlans is how many VM and VMI updates waited for their pool's plan interval, over
// every pool.
func deferredPlans() float64 {
	GinkgoHelper()
	return clustersuite.Counter(scrape(), "virtrules_pool_plans_deferred_total", nil)
}

// reconcileErrors is how many of controller's reconciles returned an error.
func reconcileErrors(controller string) float64 {
	GinkgoHelper()
	return clustersuite.Counter(scrape(), "controller_runtime_reconcile_total", map[string]string{"controller": controller, "result": "error"})
}

// settledReconciles waits until controller is idle and its reconcile count has not moved for
// a second, and returns that count.
func settledReconciles(controller string) float64 {
	GinkgoHelper()
	last, lastAt := -1.0, time.Now()
	var settled float64
	Eventually(func() bool {
		controllerAlive()
		total, idle := reconciles(controller)
		if !idle || total != last {
			last, lastAt = total, time.Now()
			return false
		}
		settled = total
		return time.Since(lastAt) >= time.Second
	}).WithTimeout(10 * time.Minute).WithPolling(200 * time.Millisecond).Should(BeTrue())
	return settled
}

// usage is the controller's peak resident memory (VmHWM) in MiB and its CPU seconds (user and
// system) so far, from /proc.
func usage() (peakMiB, cpuSeconds float64) {
	GinkgoHelper()
	p, err := procfs.NewProc(controller.Process.Pid)
	Expect(err).NotTo(HaveOccurred())
	status, err := p.NewStatus()
	Expect(err).NotTo(HaveOccurred())
	stat, err := p.Stat()
	Expect(err).NotTo(HaveOccurred())
	return float64(status.VmHWM) / (1 << 20), stat.CPUTime()
}

// saveHeapProfile keeps the controller's heap profile (its --pprof-bind-address) beside the
// scale log, for `go tool pprof`, and records the Go heap figures from its /metrics.
func saveHeapProfile() {
	GinkgoHelper()
	code, body := httpGet("http://" + pprofAddr + "/debug/pprof/heap")
	Expect(code).To(Equal(200), "heap profile: %s", body)
	path := filepath.Join(os.TempDir(), "virt-rules-scale-heap.pprof")
	Expect(os.WriteFile(path, []byte(body), 0o644)).To(Succeed())
	m := scrape()
	measured("controller heap", "Go heap in use %.0f MiB, Go runtime total %.0f MiB now; profile in %s",
		gauge(m, "go_memstats_heap_inuse_bytes")/(1<<20), gauge(m, "go_memstats_sys_bytes")/(1<<20), path)
}

// profileCPU records the controller's CPU profile over the next seconds into
// $TMPDIR/virt-rules-scale-cpu-<name>.pprof, in the background; wait for it with the returned
// function, which says where it is (or why not: a profile is for reading, never a result).
func profileCPU(name string, seconds int) (wait func()) {
	done := make(chan string, 1)
	go func() {
		code, body := httpGetWithin(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", pprofAddr, seconds), time.Duration(seconds+30)*time.Second)
		if code != 200 {
			done <- fmt.Sprintf("no CPU profile (%d): %.200s", code, body)
			return
		}
		path := filepath.Join(os.TempDir(), "virt-rules-scale-cpu-"+name+".pprof")
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			done <- fmt.Sprintf("no CPU profile: %v", err)
			return
		}
		done <- "CPU profile in " + path
	}()
	return func() { progress("%s: %s", name, <-done) }
}

// gauge is the value of an unlabelled gauge, 0 when absent.
func gauge(families map[string]*dto.MetricFamily, name string) float64 {
	if f := families[name]; f != nil && len(f.GetMetric()) > 0 {
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	return 0
}

// memTotal is the machine's memory, from /proc/meminfo.
func memTotal() string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return "unknown"
	}
	mi, err := fs.Meminfo()
	if err != nil || mi.MemTotal == nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB", float64(*mi.MemTotal)/(1<<20))
}

func httpGet(url string) (int, string) { return httpGetWithin(url, 10*time.Second) }

// httpGetWithin GETs url, giving up after timeout: its status code and body, or 0 and why.
func httpGetWithin(url string, timeout time.Duration) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	return clustersuite.HTTPDo(http.DefaultClient, req)
}

// ms renders seconds as milliseconds.
func ms(seconds float64) string {
	if math.IsNaN(seconds) || math.IsInf(seconds, 0) {
		return fmt.Sprint(seconds)
	}
	return fmt.Sprintf("%.1f ms", seconds*1000)
}

func durationsMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return float64(s[max(i, 0)]) / float64(time.Millisecond)
}

// apiRequests is kube-apiserver's requests over a stage, by verb and resource
// (apiserver_request_total), and its CPU seconds (process_cpu_seconds_total): what the API
// server spent the stage on, whoever asked.
type apiRequests struct {
	before   map[string]float64
	webhooks map[string][2]float64
	cpu      float64
	machine  cpuUse
}

func startAPIRequests() apiRequests {
	GinkgoHelper()
	m := scrapeAPIServer()
	return apiRequests{before: requestsByKind(m), webhooks: admissionByWebhook(m), cpu: clustersuite.Counter(m, "process_cpu_seconds_total", nil), machine: readCPUUse()}
}

// cpuUse is where the machine's CPU time has gone so far: each process of the test cluster
// (this process's children: etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
// kwok, KubeVirt's virt-api and virt-controller, the virt-rules controller) by its command's
// name, this process (the harness and the virt-handler stand-in), and the whole machine's busy
// time (/proc/stat: every CPU's time neither idle nor waiting on I/O), so that a stage's
// report says whether the machine had CPU to spare and who used it.
type cpuUse struct {
	at        time.Time
	byProcess map[string]float64
	busy      float64
}

// harnessProcess is this process's name in a CPU report.
const harnessProcess = "this test (harness, virt-handler stand-in)"

func readCPUUse() cpuUse {
	GinkgoHelper()
	fs, err := procfs.NewDefaultFS()
	Expect(err).NotTo(HaveOccurred())
	u := cpuUse{at: time.Now(), byProcess: map[string]float64{}}
	procs, err := fs.AllProcs()
	Expect(err).NotTo(HaveOccurred())
	self := os.Getpid()
	for _, p := range procs {
		stat, err := p.Stat()
		if err != nil || (stat.PPID != self && p.PID != self) {
			continue // gone since listed, or not the test's
		}
		name := harnessProcess
		if p.PID != self {
			name = stat.Comm
			if args, err := p.CmdLine(); err == nil && len(args) > 0 {
				name = filepath.Base(args[0])
			}
		}
		u.byProcess[name] += stat.CPUTime()
	}
	st, err := fs.Stat()
	Expect(err).NotTo(HaveOccurred())
	t := st.CPUTotal
	u.busy = t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ + t.Steal
	return u
}

// report records the CPU the machine had over the stage, how much of it was busy, and the
// processes that used it, most first; "other" is the rest of the busy time (the kernel, and
// anything else running on the machine).
func (a cpuUse) report(what string) {
	GinkgoHelper()
	b := readCPUUse()
	elapsed := b.at.Sub(a.at).Seconds()
	type use struct {
		name    string
		seconds float64
	}
	var uses []use
	var listed float64
	for name, v := range b.byProcess {
		d := v - a.byProcess[name]
		if d < 0 { // restarted during the stage
			d = v
		}
		uses = append(uses, use{name, d})
		listed += d
	}
	slices.SortFunc(uses, func(x, y use) int { return cmp.Compare(y.seconds, x.seconds) })
	busy := b.busy - a.busy
	parts := make([]string, 0, len(uses)+1)
	for _, u := range uses {
		if u.seconds >= 0.5 {
			parts = append(parts, fmt.Sprintf("%s %.0f", u.name, u.seconds))
		}
	}
	parts = append(parts, fmt.Sprintf("other %.0f", max(0, busy-listed)))
	cpus := runtime.NumCPU()
	measured(what+": CPU", "%.0f of the %.0f CPU seconds the machine had (%d CPUs × %s) busy (%.0f%%): %s",
		busy, float64(cpus)*elapsed, cpus, time.Duration(elapsed*float64(time.Second)).Round(time.Second),
		100*busy/(float64(cpus)*elapsed), strings.Join(parts, ", "))
}

// admissionByWebhook is, per admission webhook the API server calls (KubeVirt's and
// virt-rules'), its calls and their total seconds, as the API server timed them
// (apiserver_admission_webhook_admission_duration_seconds).
func admissionByWebhook(m map[string]*dto.MetricFamily) map[string][2]float64 {
	out := map[string][2]float64{}
	for _, s := range clustersuite.Series(m, "apiserver_admission_webhook_admission_duration_seconds", nil) {
		name := ""
		for _, p := range s.GetLabel() {
			if p.GetName() == "name" {
				name = p.GetValue()
			}
		}
		v := out[name]
		out[name] = [2]float64{v[0] + float64(s.GetHistogram().GetSampleCount()), v[1] + s.GetHistogram().GetSampleSum()}
	}
	return out
}

// requestsByKind sums apiserver_request_total by "VERB resource[/subresource]".
func requestsByKind(m map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, s := range clustersuite.Series(m, "apiserver_request_total", nil) {
		l := map[string]string{}
		for _, p := range s.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		kind := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			kind += "/" + l["subresource"]
		}
		out[kind] += s.GetCounter().GetValue()
	}
	return out
}

// report records the stage's most frequent requests (top n) and the API server's CPU.
func (a apiRequests) report(what string, n int) {
	GinkgoHelper()
	m := scrapeAPIServer()
	type kindCount struct {
		kind  string
		count float64
	}
	var counts []kindCount
	for kind, v := range requestsByKind(m) {
		if d := v - a.before[kind]; d > 0 {
			counts = append(counts, kindCount{kind, d})
		}
	}
	slices.SortFunc(counts, func(x, y kindCount) int { return cmp.Compare(y.count, x.count) })
	parts := make([]string, 0, n)
	for _, c := range counts[:min(n, len(counts))] {
		parts = append(parts, fmt.Sprintf("%.0f %s", c.count, c.kind))
	}
	measured(what+": API server", "%.1f CPU seconds; requests: %s", clustersuite.Counter(m, "process_cpu_seconds_total", nil)-a.cpu, strings.Join(parts, ", "))
	a.machine.report(what)
	var hooks []kindCount // by the time requests waited on them
	calls := map[string]float64{}
	for name, v := range admissionByWebhook(m) {
		if d := v[0] - a.webhooks[name][0]; d > 0 {
			hooks = append(hooks, kindCount{name, v[1] - a.webhooks[name][1]})
			calls[name] = d
		}
	}
	slices.SortFunc(hooks, func(x, y kindCount) int { return cmp.Compare(y.count, x.count) })
	parts = parts[:0]
	for _, h := range hooks[:min(4, len(hooks))] {
		parts = append(parts, fmt.Sprintf("%s %.0f calls, mean %s", h.kind, calls[h.kind], ms(h.count/calls[h.kind])))
	}
	if len(parts) > 0 {
		measured(what+": admission webhooks", "as the API server timed them: %s", strings.Join(parts, "; "))
	}
}
