package migrationpolicy

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/virt-rules/virt-rules/engine"
)

// policyCache lists its policies as the manager's cache would, and no KubeVirt CR.
type policyCache struct {
	client.Reader
	policies []unstructured.Unstructured
}

func (c policyCache) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	if l, ok := list.(*unstructured.UnstructuredList); ok && l.GroupVersionKind().Kind == GVKMigrationPolicy.Kind+"List" {
		l.Items = c.policies
	}
	return nil
}

// BenchmarkValidatingWebhook is one CREATE through the webhook's handler, the bundle's
// validation against n stored policies (each with its own selectors, UID and
// resourceVersion), the request decoded and the answer built: what a replica spends on one
// admission, kube-apiserver and TLS aside. list: every policy listed from the cache for each
// admission; index: the policies of the admitted one's key from the PolicyIndex, as served.
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
			for _, w := range []struct {
				name    string
				webhook *ValidatingWebhook
			}{
				// Every policy listed from the cache, keyed (remembered) and bucketed.
				{"list", &ValidatingWebhook{Client: policyCache{policies: stored}, Engine: eng}},
				// The policies of the admitted one's key, from the index (as served).
				{"index", &ValidatingWebhook{Client: policyCache{}, Engine: eng, Policies: &PolicyIndex{index: index, synced: func() bool { return true }}}},
			} {
				b.Run(w.name, func(b *testing.B) {
					if resp := w.webhook.Handle(context.Background(), reqs[0]); !resp.Allowed {
						b.Fatalf("refused: %v", resp.Result)
					}
					b.ReportAllocs()
					// As in a burst of creates: the 64 policies admitted last are still pending
					// (the cache shows none of them), each under its own key.
					for i := 0; b.Loop(); i++ {
						if resp := w.webhook.Handle(context.Background(), reqs[i%len(reqs)]); !resp.Allowed {
							b.Fatalf("refused: %v", resp.Result)
						}
					}
				})
			}
		})
	}
}
