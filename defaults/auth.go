package defaults

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultAudience is the audience of the service account tokens the service accepts: a token
// the kubelet projected for the defaulter, not one for the API server, so that the defaulter
// never holds a token it could use against the API server.
const DefaultAudience = "virt-rules-defaulter"

// Auth admits a request only from a caller the API server vouches for, as a Kubernetes API
// server delegates it (k8s.io/apiserver's delegating authenticator and authorizer): the bearer
// token is checked by a TokenReview (for the audiences given), and the caller's right to the
// path by a SubjectAccessReview of the non-resource URL with the request's method as its verb
// (RBAC: nonResourceURLs [/apis/vms/defaults], verbs [post]; /metrics, verbs [get]). Answers are
// cached (a minute for tokens, 5 minutes allowed, 30 s denied).
type Auth struct {
	// audiences go into each request's context: the TokenReview asks for them only then.
	audiences authenticator.Audiences
	authn     authenticator.Request
	authz     authorizer.Authorizer
	log       *slog.Logger
	denied    *prometheus.CounterVec
}

// NewAuth asks the API server of cfg, which must let the service create TokenReviews and
// SubjectAccessReviews (the ClusterRole system:auth-delegator).
func NewAuth(cfg *rest.Config, audiences []string, log *slog.Logger) (*Auth, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create the review client: %w", err)
	}
	// Retry a failing review a few times, as the API server's own delegated authentication does.
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
		TokenAccessReviewClient:  cs.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff,
		CacheTTL:                 time.Minute,
		APIAudiences:             authenticator.Audiences(audiences),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("create the token authenticator: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("create the access review authorizer: %w", err)
	}
	return &Auth{audiences: authenticator.Audiences(audiences), authn: authn, authz: authz, log: log, denied: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "virtrules_defaults_denied_requests_total",
		Help: "Requests refused before reaching the service, by reason: unauthenticated (401), forbidden (403) or review_failed (503).",
	}, []string{"reason"})}, nil
}

// wrap serves next to the callers Auth admits.
func (a *Auth) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(authenticator.WithAudiences(r.Context(), a.audiences))
		res, ok, err := a.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			// A missing, malformed, expired or wrong-audience token alike; why goes to the log.
			a.log.DebugContext(r.Context(), "caller not authenticated", "path", r.URL.Path, "remoteAddress", r.RemoteAddr, "error", err)
			a.denied.WithLabelValues("unauthenticated").Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="virt-rules-defaulter"`)
			writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "a service account token for this service is required (Authorization: Bearer)", nil)
			return
		}
		attrs := authorizer.AttributesRecord{User: res.User, Verb: strings.ToLower(r.Method), Path: r.URL.Path}
		decision, reason, err := a.authz.Authorize(r.Context(), attrs)
		if err != nil {
			a.log.ErrorContext(r.Context(), "authorize the caller", "user", res.User.GetName(), "path", r.URL.Path, "error", err)
			a.denied.WithLabelValues("review_failed").Inc()
			writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "authorize the caller: "+err.Error(), nil)
			return
		}
		if decision != authorizer.DecisionAllow {
			a.log.InfoContext(r.Context(), "caller forbidden", "user", res.User.GetName(), "verb", attrs.Verb, "path", r.URL.Path, "reason", reason)
			a.denied.WithLabelValues("forbidden").Inc()
			writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, fmt.Sprintf("user %q may not %s %s", res.User.GetName(), attrs.Verb, r.URL.Path), nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}
