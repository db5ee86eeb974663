// Command rancher-peer plays Rancher's side of an aggregated APIService for the tests: it accepts
// the service's remotedialer tunnel at /v3/connect (with github.com/rancher/remotedialer's own
// server, checking the bearer token Rancher would have put in the APIService's Secret), and proxies
// HTTP requests through that tunnel the way Rancher's aggregation middleware does: for a caller
// Rancher authenticated, Authorization removed and the identity sent as Impersonate-User,
// Impersonate-Group and Impersonate-Extra-* headers; for one it did not, a bearer token passed on.
//
// Test-facing routes (all on the same TLS listener):
//
//	/v3/connect     the tunnel endpoint the service dials
//	/proxy/...      forwards ... through the tunnel; the caller's identity comes from the
//	                X-Test-User, X-Test-Groups (comma-separated) and X-Test-Extra-<Key> headers
//	/sessions       "1" while the service holds a tunnel session, else "0"
//
// On start it writes DIR/addr (host:port) and keeps its CA (DIR/ca.crt), key and certificate in
// DIR, so a restart with the same DIR serves the same certificate on the same port.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rancher/remotedialer"
)

const clientKey = "stv-harvester-cloud"

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	token := flag.String("token", "", "the bearer token the tunnel client must present")
	dir := flag.String("dir", "", "state directory (certificate, key, addr)")
	flag.Parse()
	if *token == "" || *dir == "" {
		log.Fatal("--token and --dir are required")
	}
	cert, err := loadOrCreateCert(*dir)
	if err != nil {
		log.Fatalf("certificate: %v", err)
	}

	server := remotedialer.New(func(req *http.Request) (string, bool, error) {
		got := strings.TrimSpace(strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "))
		return clientKey, got == *token, nil
	}, remotedialer.DefaultErrorWriter)

	mux := http.NewServeMux()
	mux.Handle("/v3/connect", server)
	mux.HandleFunc("/sessions", func(w http.ResponseWriter, _ *http.Request) {
		if server.HasSession(clientKey) {
			fmt.Fprint(w, "1")
		} else {
			fmt.Fprint(w, "0")
		}
	})
	target, _ := url.Parse("http://" + clientKey)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.URL.Path = strings.TrimPrefix(r.In.URL.Path, "/proxy")
			r.Out.URL.RawPath = ""
			r.Out.Host = clientKey
			impersonate(r.In.Header, r.Out.Header)
		},
		Transport: &http.Transport{
			DialContext:       server.Dialer(clientKey),
			DisableKeepAlives: false,
			MaxIdleConns:      64,
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "tunnel: "+err.Error(), http.StatusBadGateway)
		},
	}
	mux.HandleFunc("/proxy/", func(w http.ResponseWriter, r *http.Request) {
		// As Rancher's aggregation handler: wait up to 15 s for a session, then 503.
		for i := 0; i < 150 && !server.HasSession(clientKey); i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if !server.HasSession(clientKey) {
			http.Error(w, "Handler disconnected", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	if err := os.WriteFile(filepath.Join(*dir, "addr"), []byte(ln.Addr().String()), 0o600); err != nil {
		log.Fatalf("write addr: %v", err)
	}
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("rancher-peer listening on %s", ln.Addr())
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("serve: %v", err)
	}
}

// impersonate moves the test's X-Test-* identity headers to Impersonate-* headers and drops
// Authorization, as Rancher's proxy does for a user it authenticated. Without X-Test-User the
// caller is one Rancher did not authenticate: its bearer token, if any, is passed on, as Rancher
// does for such a caller.
func impersonate(in, out http.Header) {
	for k := range out {
		if strings.HasPrefix(k, "Impersonate-") || strings.HasPrefix(k, "X-Test-") {
			out.Del(k)
		}
	}
	user := in.Get("X-Test-User")
	if user == "" {
		if !strings.HasPrefix(in.Get("Authorization"), "Bearer ") {
			out.Del("Authorization")
		}
		return
	}
	out.Del("Authorization")
	out.Set("Impersonate-User", user)
	for _, g := range strings.Split(in.Get("X-Test-Groups"), ",") {
		if g = strings.TrimSpace(g); g != "" {
			out.Add("Impersonate-Group", g)
		}
	}
	for k, vs := range in {
		if key, ok := strings.CutPrefix(k, "X-Test-Extra-"); ok {
			for _, v := range vs {
				out.Add("Impersonate-Extra-"+key, v)
			}
		}
	}
}

// loadOrCreateCert keeps a CA (ca.crt, what the APIService's Secret carries) and a serving
// certificate for 127.0.0.1 signed by it (tls.crt, tls.key) in dir.
func loadOrCreateCert(dir string) (tls.Certificate, error) {
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if c, err := tls.LoadX509KeyPair(certFile, keyFile); err == nil {
		return c, nil
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rancher-peer CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "rancher-peer"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(30 * 24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	for name, data := range map[string][]byte{"ca.crt": caPEM, "tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return tls.Certificate{}, err
		}
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}
