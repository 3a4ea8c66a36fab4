//go:build libvirt

package cli_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/virt-rules/virt-rules/test/clustersuite"
)

var _ = Describe("defaulter", func() {
	It("refuses negative cache sizes, naming the flag", func() {
		for _, flag := range []string{"--libvirt-cache-size", "--shape-cache-size"} {
			r := run("", "defaulter", "--listen", "127.0.0.1:0", "--insecure-http", flag, "-1")
			Expect(r.exitCode).NotTo(Equal(0))
			Expect(r.stderr).To(ContainSubstring(flag + " -1: want 0 or more"))
		}
	})

	It("serves VMs of one template from one shape, as its /metrics shows", func() {
		address, base := startDefaulter()
		doc, err := os.ReadFile(filepath.Join(repoRoot, "examples", "defaults", "vm.yaml"))
		Expect(err).NotTo(HaveOccurred())
		for _, name := range []string{"first", "second"} {
			vm, err := yaml.YAMLToJSON([]byte(strings.Replace(string(doc), "name: testvm", "name: "+name, 1)))
			Expect(err).NotTo(HaveOccurred())
			resp, err := http.Post(base+"/apis/vms/defaults?dryRun=true", "application/json", bytes.NewReader(vm))
			Expect(err).NotTo(HaveOccurred())
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusOK), string(body))
			Expect(string(body)).To(ContainSubstring(`"path":"/spec/template/spec/domain/firmware"`))
		}

		resp, err := http.Get(base + "/metrics")
		Expect(err).NotTo(HaveOccurred())
		metrics, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		Expect(string(metrics)).To(ContainSubstring(`virtrules_defaults_shape_cache_requests_total{result="miss"} 1`))
		Expect(string(metrics)).To(ContainSubstring(`virtrules_defaults_shape_cache_requests_total{result="hit"} 1`))
		Expect(string(metrics)).To(ContainSubstring(`virtrules_defaults_shape_cache_entries 1`))

		By("dropping a client that sends its headers and then stalls its body")
		conn, err := net.Dial("tcp", address)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close()
		_, err = io.WriteString(conn, "POST /apis/vms/defaults HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
		Expect(err).NotTo(HaveOccurred())
		start := time.Now()
		Expect(conn.SetReadDeadline(time.Now().Add(30 * time.Second))).To(Succeed())
		_, _ = io.Copy(io.Discard, conn) // returns when the server closes the connection
		Expect(time.Since(start)).To(BeNumerically("<", 20*time.Second), "the read timeout (10 s), not the client's 30 s deadline")
	})

	It("exports the serving bundle and the decisions stopped for their budget", func() {
		// Every live decision over a 1ns budget; the trial keeps its own budget, so the
		// bundle is activated.
		_, base := startDefaulter("--decision-timeout", "1ns")
		code, body := postExampleVM(base)
		Expect(code).To(Equal(http.StatusInternalServerError), body)
		Expect(body).To(ContainSubstring("over the time budget of 1ns"))

		resp, err := http.Get(base + "/metrics")
		Expect(err).NotTo(HaveOccurred())
		metrics, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		Expect(string(metrics)).To(MatchRegexp(`virtrules_decision_budget_exceeded_total\{budget="time",decision="vm\.defaults\.[a-z_.]+"\} [1-9]`))
		Expect(string(metrics)).To(MatchRegexp(`virtrules_bundle_active_revision\{revision="[^"]+",source="embedded"\} 1`))
		Expect(string(metrics)).To(ContainSubstring(`virtrules_defaults_request_duration_seconds_count{code="500",dry_run="true"} 1`))
	})

	// libvirt's QEMU driver really starts here, in the defaulter's process, and really fails:
	// with no qemu-system binary on PATH it finds no machine to offer; with a root that is a
	// file it has no state directory. Either way the defaulter exits non-zero, naming what
	// failed, so that the kubelet restarts it, instead of retrying in-process with /readyz 503.
	It("exits with an error naming the driver when libvirt's QEMU driver fails to start", func() {
		root, err := os.MkdirTemp("/dev/shm", "virt-rules-cli-defaulter-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(os.RemoveAll, root)
		notADir := writeTemp("not-a-directory", "")
		for _, c := range []struct {
			name, root string
			env        []string
			want       string
		}{
			{name: "no QEMU on PATH", root: root, env: []string{"PATH=" + GinkgoT().TempDir()}, want: "QEMU offers no x86_64 machine"},
			{name: "a root that is a file", root: notADir, want: notADir},
		} {
			cmd := exec.Command(binary, "defaulter", "--listen", "127.0.0.1:0", "--insecure-http", "--libvirt-root", c.root)
			cmd.Dir = repoRoot
			cmd.Env = append(os.Environ(), c.env...)
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = GinkgoWriter, io.MultiWriter(GinkgoWriter, &stderr)
			Expect(cmd.Start()).To(Succeed())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				<-done
				Fail(c.name + ": still running a minute after the driver failed: " + stderr.String())
			}
			var exit *exec.ExitError
			Expect(errors.As(err, &exit)).To(BeTrue(), "%s: %v", c.name, err)
			Expect(exit.ExitCode()).To(Equal(1), c.name)
			Expect(stderr.String()).To(MatchRegexp(`(?m)^error: start libvirt's QEMU driver \(--libvirt-root %s\): libvirt unavailable: .*%s`,
				regexp.QuoteMeta(c.root), regexp.QuoteMeta(c.want)), c.name)
		}
	})
})

var _ = Describe("defaulter --candidate-bundle (shadow rollout)", func() {
	It("answers with the active bundle and counts where the candidate defaults otherwise", func() {
		// The candidate gives a NIC without a model e1000e where the shipped bundle gives
		// virtio.
		candidate := copyBundle(false)
		plan := filepath.Join(candidate, "virtrules", "vm", "defaults", "plan.rego")
		src, err := os.ReadFile(plan)
		Expect(err).NotTo(HaveOccurred())
		changed := strings.Replace(string(src), `object.get(iface, "model", "virtio")`, `object.get(iface, "model", "e1000e")`, 1)
		Expect(changed).NotTo(Equal(string(src)), "plan.rego defaults a NIC's model to virtio")
		Expect(os.WriteFile(plan, []byte(changed), 0o644)).To(Succeed())
		_, base := startDefaulter("--candidate-bundle", candidate)

		code, body := postExampleVM(base)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).To(ContainSubstring(`"path":"/spec/template/spec/domain/devices/interfaces/0/model","value":"virtio"`))
		Expect(body).NotTo(ContainSubstring("e1000e"))

		metrics := func() string {
			resp, err := http.Get(base + "/metrics")
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		Eventually(metrics).WithTimeout(time.Minute).Should(
			ContainSubstring(`virtrules_candidate_decision_differences_total{decision="vm.defaults.defaults"} 1`))
		Expect(metrics()).To(ContainSubstring(`virtrules_candidate_decision_comparisons_total{decision="vm.defaults.defaults",result="different"} 1`))
		Expect(metrics()).To(ContainSubstring(`virtrules_candidate_bundle_load_successes_total 1`))
	})

	It("counts a refused candidate as the candidate's and keeps answering with the active bundle", func() {
		server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "no bundle at all")
		}))
		DeferCleanup(server.Close)
		_, base := startDefaulter("--candidate-bundle-url", server.URL+"/candidate.tar.gz", "--candidate-bundle-allow-http",
			"--candidate-bundle-poll-interval", "1s")
		Eventually(func() string {
			resp, err := http.Get(base + "/metrics")
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}).WithTimeout(time.Minute).Should(And(
			MatchRegexp(`virtrules_candidate_bundle_load_failures_total\{reason="[a-z]+"\} [2-9]`),
			Not(ContainSubstring(`virtrules_bundle_load_failures_total{`)),
			MatchRegexp(`virtrules_bundle_active_revision\{revision="[^"]+",source="embedded"\} 1`)))

		code, body := postExampleVM(base)
		Expect(code).To(Equal(http.StatusOK), body)
	})
})

// startDefaulter runs the real binary's defaulter on a free local address (plain HTTP) with
// extra flags until the spec ends, and waits until it is ready; it returns the address and
// its base URL.
func startDefaulter(extra ...string) (string, string) {
	GinkgoHelper()
	root, err := os.MkdirTemp("/dev/shm", "virt-rules-cli-defaulter-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, root)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	address := ln.Addr().String()
	Expect(ln.Close()).To(Succeed())

	cmd := exec.Command(binary, append([]string{"defaulter", "--listen", address, "--libvirt-root", root, "--insecure-http"}, extra...)...)
	cmd.Dir = repoRoot
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = GinkgoWriter, io.MultiWriter(GinkgoWriter, &stderr)
	Expect(cmd.Start()).To(Succeed())
	DeferCleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	base := "http://" + address
	Eventually(clustersuite.HTTPStatus(http.DefaultClient, base+"/readyz"), 2*time.Minute, 200*time.Millisecond).Should(Equal(http.StatusOK), "ready once libvirt is probed: %s", &stderr)
	return address, base
}

// postExampleVM posts examples/defaults/vm.yaml to the defaulter at base as a dry run and
// returns the status code and body.
func postExampleVM(base string) (int, string) {
	GinkgoHelper()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "examples", "defaults", "vm.yaml"))
	Expect(err).NotTo(HaveOccurred())
	vm, err := yaml.YAMLToJSON(doc)
	Expect(err).NotTo(HaveOccurred())
	resp, err := http.Post(base+"/apis/vms/defaults?dryRun=true", "application/json", bytes.NewReader(vm))
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}
