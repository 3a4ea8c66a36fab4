package defaults

import (
	"log/slog"

	"k8s.io/client-go/rest"

	"github.com/virt-rules/virt-rules/internal/delegatedauth"
)

// DefaultAudience is the audience of the service account tokens the service accepts: a token
// the kubelet projected for the defaulter, not one for the API server, so that the defaulter
// never holds a token it could use against the API server.
const DefaultAudience = "virt-rules-defaulter"

// Auth admits a request only from a caller the API server vouches for (internal/delegatedauth):
// the bearer token is checked by a TokenReview (for the audiences given), and the caller's
// right to the path by a SubjectAccessReview of the non-resource URL with the request's method
// as its verb (RBAC: nonResourceURLs [/apis/vms/defaults], verbs [post]; /metrics, verbs
// [get]). Refusals are counted by virtrules_defaults_denied_requests_total{reason}.
type Auth struct {
	*delegatedauth.Auth
}

// NewAuth asks the API server of cfg, which must let the service create TokenReviews and
// SubjectAccessReviews (the ClusterRole system:auth-delegator).
func NewAuth(cfg *rest.Config, audiences []string, log *slog.Logger) (*Auth, error) {
	a, err := delegatedauth.New(cfg, delegatedauth.Options{
		Audiences: audiences, Realm: "virt-rules-defaulter", Metric: "virtrules_defaults_denied_requests_total", Log: log,
	})
	if err != nil {
		return nil, err
	}
	return &Auth{a}, nil
}
