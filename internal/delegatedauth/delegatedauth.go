// Package delegatedauth admits an HTTP request only from a caller the Kubernetes API server
// vouches for, as an aggregated API server delegates it (k8s.io/apiserver's delegating
// authenticator and authorizer): the bearer token is checked by a TokenReview, and the
// caller's right to the path by a SubjectAccessReview of the non-resource URL with the
// request's method as its verb. The defaulter's API and the controller's /metrics use it.
//
// Every refusal is a Kubernetes Status object: 401 for a missing, malformed, expired or
// wrong-audience token (why goes to the debug log), 403 for a caller not allowed the path,
// 503 when the access review itself failed. Each is counted by reason.
package delegatedauth

import (
	"encoding/json"
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

// Options say what the caller must present and how refusals are reported.
type Options struct {
	// Audiences the token must be bound to; none: the API server's own.
	Audiences []string
	// Realm of the WWW-Authenticate header of a 401.
	Realm string
	// Metric is the name of the counter of refused requests, by reason.
	Metric string
	// Log gets each refusal; nil discards them.
	Log *slog.Logger
	// Resource, when set and true for a request, gives the resource the caller must be
	// allowed (verb, group, resource, namespace, name) instead of the non-resource path: a
	// subresource-like endpoint is reviewed as the object it serves.
	Resource func(*http.Request) (authorizer.AttributesRecord, bool)
}

// Auth wraps handlers so that only admitted callers reach them. Answers of the API server are
// cached: a minute for tokens, 5 minutes for allowed, 30 s for denied access.
type Auth struct {
	opts   Options
	authn  authenticator.Request
	authz  authorizer.Authorizer
	denied *prometheus.CounterVec
}

// New asks the API server of cfg, which must let the caller of New create TokenReviews and
// SubjectAccessReviews (the ClusterRole system:auth-delegator).
func New(cfg *rest.Config, opts Options) (*Auth, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
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
		APIAudiences:             authenticator.Audiences(opts.Audiences),
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
	return &Auth{opts: opts, authn: authn, authz: authz, denied: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: opts.Metric,
		Help: "Requests refused before reaching the service, by reason: unauthenticated (401), forbidden (403) or review_failed (503).",
	}, []string{"reason"})}, nil
}

// Collector counts the refused requests, for the caller's registry.
func (a *Auth) Collector() prometheus.Collector { return a.denied }

// Wrap serves next to the callers a admits.
func (a *Auth) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(a.opts.Audiences) > 0 {
			r = r.WithContext(authenticator.WithAudiences(r.Context(), authenticator.Audiences(a.opts.Audiences)))
		}
		res, ok, err := a.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			// A missing, malformed, expired or wrong-audience token alike; why goes to the log.
			a.opts.Log.DebugContext(r.Context(), "caller not authenticated", "path", r.URL.Path, "remoteAddress", r.RemoteAddr, "error", err)
			a.denied.WithLabelValues("unauthenticated").Inc()
			w.Header().Set("WWW-Authenticate", fmt.Sprintf("Bearer realm=%q", a.opts.Realm))
			WriteStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "a service account token for this service is required (Authorization: Bearer)")
			return
		}
		attrs := authorizer.AttributesRecord{User: res.User, Verb: strings.ToLower(r.Method), Path: r.URL.Path}
		what := r.URL.Path
		if a.opts.Resource != nil {
			if ra, ok := a.opts.Resource(r); ok {
				ra.User = res.User
				attrs = ra
				what = fmt.Sprintf("%s.%s %s in namespace %s", ra.Resource, ra.APIGroup, ra.Name, ra.Namespace)
			}
		}
		decision, reason, err := a.authz.Authorize(r.Context(), attrs)
		if err != nil {
			a.opts.Log.ErrorContext(r.Context(), "authorize the caller", "user", res.User.GetName(), "path", r.URL.Path, "error", err)
			a.denied.WithLabelValues("review_failed").Inc()
			WriteStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "authorize the caller: "+err.Error())
			return
		}
		if decision != authorizer.DecisionAllow {
			a.opts.Log.InfoContext(r.Context(), "caller forbidden", "user", res.User.GetName(), "verb", attrs.Verb, "path", r.URL.Path, "reason", reason)
			a.denied.WithLabelValues("forbidden").Inc()
			WriteStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, fmt.Sprintf("user %q may not %s %s", res.User.GetName(), attrs.Verb, what))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// WriteStatus answers a Kubernetes Status object of code.
func WriteStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	body, _ := json.Marshal(&metav1.Status{ // a Status always encodes
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
