package controllers

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// webhookDuration is how long each of virt-rules' admission webhooks takes to answer, in
// buckets fine enough around the tens of milliseconds that a p99 against a 50 ms bound can be
// read from it: controller-runtime's own controller_runtime_webhook_latency_seconds has
// buckets a decade apart, where 15 ms and 95 ms fall in one.
var webhookDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "virtrules_webhook_duration_seconds",
	Help:    "Time virt-rules took to answer one admission review, by webhook path (decoding the request and encoding the answer included).",
	Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
}, []string{"webhook"})

func init() {
	metrics.Registry.MustRegister(webhookDuration)
}

// timedWebhook is h, its answers timed in virtrules_webhook_duration_seconds under path.
func timedWebhook(path string, h http.Handler) http.Handler {
	return promhttp.InstrumentHandlerDuration(webhookDuration.MustCurryWith(prometheus.Labels{"webhook": path}), h)
}
