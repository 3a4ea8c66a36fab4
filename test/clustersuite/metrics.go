package clustersuite

import (
	"context"
	"io"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// APIServerMetrics reads kube-apiserver's /metrics as cfg's user.
func APIServerMetrics(ctx context.Context, cfg *rest.Config) map[string]*dto.MetricFamily {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	Expect(err).NotTo(HaveOccurred(), "GET kube-apiserver's /metrics")
	defer body.Close()
	return ParseMetrics(body)
}

// ParseMetrics reads metrics in Prometheus' text format.
func ParseMetrics(body io.Reader) map[string]*dto.MetricFamily {
	GinkgoHelper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(body)
	Expect(err).NotTo(HaveOccurred(), "parse metrics in Prometheus' text format")
	return families
}

// Series are the metrics of family name whose labels include every pair of labels.
func Series(families map[string]*dto.MetricFamily, name string, labels map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range families[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			if have[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// Counter sums the counters (or gauges) of family name whose labels include labels.
func Counter(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	sum := 0.0
	for _, m := range Series(families, name, labels) {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}
