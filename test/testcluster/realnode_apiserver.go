package testcluster

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// kubernetesServiceIP is the ClusterIP of Service default/kubernetes, the first of envtest's
// service range (10.0.0.0/24): what a pod's in-cluster configuration dials
// (KUBERNETES_SERVICE_HOST), and so a name the certificate it is served must carry.
var kubernetesServiceIP = net.IPv4(10, 0, 0, 1)

// configureForRealNodes sets kube-apiserver up as real nodes and the pods on them need it
// (Options.RealNodes):
//
//   - it reaches a kubelet at the node's InternalIP (a real node's Hostname address is its
//     name, which nothing resolves), with a client certificate of the cluster's CA, which the
//     kubelet trusts;
//   - it calls a webhook's Service at one of its endpoints (--enable-aggregator-routing),
//     there being no kube-proxy to route a ClusterIP;
//   - its ServiceAccount admission runs (envtest turns it off), so that a pod gets its
//     ServiceAccount's token and the CA that signed the API's certificate.
func (c *Cluster) configureForRealNodes(api *envtest.APIServer) error {
	kubeletCert, kubeletKey, err := c.ca.issue("kube-apiserver-kubelet-client", "kube-apiserver-kubelet-client")
	if err != nil {
		return err
	}
	api.Configure().
		Set("kubelet-preferred-address-types", "InternalIP").
		Set("kubelet-client-certificate", kubeletCert).
		Set("kubelet-client-key", kubeletKey).
		Set("enable-aggregator-routing", "true").
		Disable("disable-admission-plugins")
	return nil
}

// rootCA is what kube-controller-manager publishes to every namespace as kube-root-ca.crt,
// which a pod trusts as its API server's CA: envtest's, which signed kube-apiserver's
// certificate, and, for real nodes, the cluster's, which signed the API proxy's.
func (c *Cluster) rootCA() ([]byte, error) {
	if !c.realNodes {
		return c.Config.CAData, nil
	}
	ours, err := readFile(c.ca.certFile)
	if err != nil {
		return nil, err
	}
	return bytes.Join([][]byte{bytes.TrimSpace(c.Config.CAData), ours}, []byte("\n")), nil
}

// apiProxy is kube-apiserver as a pod reaches it at the kubernetes Service, in place of
// kube-proxy: envtest's kube-apiserver listens on 127.0.0.1 with a certificate for localhost
// only, which a pod's in-cluster client, dialling the Service's ClusterIP, would refuse. The
// proxy serves a certificate of the cluster's CA for that address and the Service's names and
// passes each request on as it came (the pod's ServiceAccount token authenticates it), watches
// streamed.
type apiProxy struct {
	// addr is where it listens, on 127.0.0.1.
	addr   string
	server *http.Server
	done   chan error
}

// startAPIProxy starts the cluster's API proxy.
func (c *Cluster) startAPIProxy() (*apiProxy, error) {
	certFile, keyFile, err := c.ca.issueFor("kubernetes-service", "kubernetes", []net.IP{kubernetesServiceIP},
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(c.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("parse kube-apiserver's address: %w", err)
	}
	// Anonymous: the proxy adds no credentials of its own, only the caller's reach the API.
	transport, err := rest.TransportFor(rest.AnonymousClientConfig(c.Config))
	if err != nil {
		return nil, fmt.Errorf("API proxy transport: %w", err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = transport
	proxy.FlushInterval = -1
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for the API proxy: %w", err)
	}
	p := &apiProxy{
		addr:   l.Addr().String(),
		server: &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second},
		done:   make(chan error, 1),
	}
	// ServeTLS, unlike Serve on a TLS listener, speaks HTTP/2, as client-go does.
	go func() { p.done <- p.server.ServeTLS(l, certFile, keyFile) }()
	c.log.Info("API proxy for pods listening", "addr", p.addr)
	return p, nil
}

// stop closes the proxy and its connections, watches included (which Shutdown would wait
// for).
func (p *apiProxy) stop() error {
	err := p.server.Close()
	if serveErr := <-p.done; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	if err != nil {
		return fmt.Errorf("stop API proxy: %w", err)
	}
	return nil
}
