package migrationpolicy

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/engine"
)

// BenchmarkValidatingWebhook is one CREATE through the webhook's handler, the bundle's
// validation against n stored policies (each with its own selectors, UID and
// resourceVersion), the request decoded and the answer built: what a replica spends on one
// admission, kube-apiserver and TLS aside. The policies of the admitted one's key come from the
// PolicyIndex, as served.
func BenchmarkValidatingWebhook(b *testing.B) {
	eng, err := engine.New(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{50, 1_000, 10_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			stored := make([]unstructured.Unstructured, n)
			for i := range stored {
				p := &stored[i]
				p.SetGroupVersionKind(GVKMigrationPolicy)
				p.SetName(fmt.Sprintf("policy-%d", i))
				p.SetUID(types.UID(fmt.Sprintf("uid-%d", i)))
				p.SetResourceVersion("1")
				p.Object["spec"] = map[string]any{"selectors": map[string]any{
					"virtualMachineInstanceSelector": map[string]any{"team": fmt.Sprintf("team-%d", i)},
				}}
			}
			reqs := make([]admission.Request, 64)
			for i := range reqs {
				reqs[i] = createRequest(b, fmt.Sprintf("new-%d", i), fmt.Sprintf("new-%d", i))
			}
			index := eng.NewMigrationPolicyIndex()
			for i := range stored {
				index.Upsert(&stored[i])
			}
			w := &ValidatingWebhook{Client: emptyCache{}, Engine: eng, Policies: &PolicyIndex{index: index, synced: func() bool { return true }}}
			if resp := w.Handle(context.Background(), reqs[0]); !resp.Allowed {
				b.Fatalf("refused: %v", resp.Result)
			}
			b.ReportAllocs()
			// As in a burst of creates: the 64 policies admitted last are still pending (the
			// cache shows none of them), each under its own key.
			for i := 0; b.Loop(); i++ {
				if resp := w.Handle(context.Background(), reqs[i%len(reqs)]); !resp.Allowed {
					b.Fatalf("refused: %v", resp.Result)
				}
			}
		})
	}
}
