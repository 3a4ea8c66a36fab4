package kubevirt_test

import (
	"slices"
	"sync"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// warnedClient is a client of the cluster as its admin that keeps the warnings the API server
// sends it.
func warnedClient() (client.Client, *warningLog) {
	warnings := &warningLog{}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.WarningHandler = warnings
	c, err := client.New(cfg, client.Options{})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return c, warnings
}

// warningLog keeps the warnings the API server sends a client.
type warningLog struct {
	mu   sync.Mutex
	list []string
}

func (w *warningLog) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warningLog) texts() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.list)
}
