// Command upstream-cloudconfig serves Harvester's own cloud-config handler
// (github.com/harvester/harvester/pkg/api/kubeconfig) on a loopback port against a control plane,
// so that tests/cloud_config_upstream.rs can send it the same requests as our service and compare
// the answers and the objects each made.
//
// It is wired as Harvester's server wires it (pkg/server/types.go and router.go of the version it is
// built against): a lasso shared controller factory, wrangler's core and rbac factories in a
// config.Scaled, kubeconfig.NewGenerateHandler(scaled, options) wrapped by pkg/server/http's
// NewHandler, and mounted on a gorilla/mux router with encoded paths, strict slashes and rancher's
// urlbuilder.RedirectRewrite at /v1/harvester/kubeconfig, for the methods and with the
// Impersonate-Extra-Username rule of that version's router (the rule is a function Harvester does
// not export, so it is restated here). Harvester also wraps its whole server in steve's AlwaysAdmin
// authenticator; the handler never reads the user it sets, so that wrapper is left out.
//
// Besides the handler it answers one route of its own, /peer/cache, which says what the handler's
// informer caches hold (the test waits until they have caught up with the API server, because the
// handler reads only its caches and a test must not race them).
//
// On start it writes ADDR-FILE (host:port) once the caches have synced, and "version <v>" on stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/gorilla/mux"
	"github.com/rancher/apiserver/pkg/urlbuilder"
	"github.com/rancher/lasso/pkg/controller"
	wcore "github.com/rancher/wrangler/v3/pkg/generated/controllers/core"
	wrbac "github.com/rancher/wrangler/v3/pkg/generated/controllers/rbac"
	"github.com/rancher/wrangler/v3/pkg/generic"
	"github.com/rancher/wrangler/v3/pkg/start"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/harvester/harvester/pkg/api/kubeconfig"
	"github.com/harvester/harvester/pkg/config"
	harvesterServer "github.com/harvester/harvester/pkg/server/http"
)

const harvesterModule = "github.com/harvester/harvester"

// harvesterVersion is set with -ldflags -X when this file is built inside a harvester checkout
// (scripts/interop-cloudconfig.sh), where the build info has no version for the main module.
var harvesterVersion string

// routerRules is what a version's router does in front of the handler.
type routerRules struct {
	methods []string
	// extraUsername: "" no check, "admin" the header must be exactly admin, "nonempty" it must be set.
	extraUsername string
}

// rulesFor returns the router rules of a Harvester version, from its pkg/server/router.go. An
// unknown version is an error rather than a guess: the routes are part of what is compared.
func rulesFor(version string) (routerRules, error) {
	switch {
	case version == "v1.8.0" || strings.HasPrefix(version, "v1.8.0-"):
		return routerRules{methods: []string{http.MethodPost}}, nil
	case version == "v1.8.1" || strings.HasPrefix(version, "v1.8.1-"):
		return routerRules{methods: []string{http.MethodPost}, extraUsername: "admin"}, nil
	case version == "v1.8.2" || strings.HasPrefix(version, "v1.8.2-"):
		return routerRules{methods: []string{http.MethodPost}, extraUsername: "nonempty"}, nil
	case strings.HasPrefix(version, "v1.9."):
		return routerRules{methods: []string{http.MethodPost, http.MethodGet}, extraUsername: "nonempty"}, nil
	}
	return routerRules{}, fmt.Errorf("no router rules known for harvester %q (read its pkg/server/router.go and add them)", version)
}

func moduleVersion() string {
	if harvesterVersion != "" {
		return harvesterVersion
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, dep := range info.Deps {
		if dep.Path == harvesterModule {
			return dep.Version
		}
	}
	return ""
}

// impersonation applies the version's Impersonate-Extra-Username rule, answering as Harvester's
// router does (401, body "Unauthorized").
func impersonation(rule string, next http.Handler) http.Handler {
	if rule == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("Impersonate-Extra-Username")
		if (rule == "admin" && user != "admin") || (rule == "nonempty" && user == "") {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte("Unauthorized"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cacheView answers /peer/cache?kind=K&namespace=N&name=X with {"exists":…,"resourceVersion":…}
// from the same shared informer caches the handler reads.
type cacheView struct {
	core *wcore.Factory
	rbac *wrbac.Factory
}

func (c cacheView) get(kind, ns, name string) (metav1.Object, error) {
	switch kind {
	case "serviceaccount":
		return c.core.Core().V1().ServiceAccount().Cache().Get(ns, name)
	case "secret":
		return c.core.Core().V1().Secret().Cache().Get(ns, name)
	case "configmap":
		return c.core.Core().V1().ConfigMap().Cache().Get(ns, name)
	case "rolebinding":
		return c.rbac.Rbac().V1().RoleBinding().Cache().Get(ns, name)
	case "clusterrolebinding":
		return c.rbac.Rbac().V1().ClusterRoleBinding().Cache().Get(name)
	case "clusterrole":
		return c.rbac.Rbac().V1().ClusterRole().Cache().Get(name)
	}
	return nil, fmt.Errorf("unknown kind %q", kind)
}

func (c cacheView) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	obj, err := c.get(q.Get("kind"), q.Get("namespace"), q.Get("name"))
	out := map[string]any{"exists": false}
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	default:
		out["exists"] = true
		out["resourceVersion"] = obj.GetResourceVersion()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func main() {
	// A flag set of our own: a dependency registers -kubeconfig on the global one in its init.
	flags := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	kubeconfigPath := flags.String("kubeconfig", "", "kubeconfig of the control plane (Harvester runs with cluster-wide rights)")
	listen := flags.String("listen", "127.0.0.1:0", "address to listen on")
	addrFile := flags.String("addr-file", "", "file to write host:port to once ready")
	namespace := flags.String("namespace", "harvester-system", "Harvester's namespace (the vip ConfigMap's)")
	printVersion := flags.Bool("version", false, "print the harvester version this was built against and exit")
	_ = flags.Parse(os.Args[1:])

	version := moduleVersion()
	if *printVersion {
		fmt.Println(version)
		return
	}
	rules, err := rulesFor(version)
	if err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stderr, "upstream-cloudconfig: version %s\n", version)

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfigPath)
	if err != nil {
		fail(fmt.Errorf("kubeconfig %s: %w", *kubeconfigPath, err))
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fail(err)
	}
	shared, err := controller.NewSharedControllerFactoryFromConfig(restConfig, scheme)
	if err != nil {
		fail(err)
	}
	opts := &generic.FactoryOptions{SharedControllerFactory: shared}
	core, err := wcore.NewFactoryFromConfigWithOptions(restConfig, opts)
	if err != nil {
		fail(err)
	}
	rbac, err := wrbac.NewFactoryFromConfigWithOptions(restConfig, opts)
	if err != nil {
		fail(err)
	}
	// Only the fields the handler reads; Harvester's SetupScaled fills the rest from the same
	// shared factory.
	scaled := &config.Scaled{Ctx: ctx, CoreFactory: core, RbacFactory: rbac}
	handler := harvesterServer.NewHandler(kubeconfig.NewGenerateHandler(scaled, config.Options{Namespace: *namespace}))
	view := cacheView{core: core, rbac: rbac}
	// The handler registered its caches above; the view's ConfigMap cache is the same one.
	_ = core.Core().V1().ConfigMap().Cache()

	// As scaled.Start does: start.All syncs every cache, then starts the controllers.
	if err := start.All(ctx, 1, core, rbac); err != nil {
		fail(fmt.Errorf("start the caches: %w", err))
	}

	m := mux.NewRouter()
	m.UseEncodedPath()
	m.StrictSlash(true)
	m.Use(urlbuilder.RedirectRewrite)
	for _, method := range rules.methods {
		m.Path("/v1/harvester/kubeconfig").Methods(method).Handler(impersonation(rules.extraUsername, handler))
	}
	m.Path("/peer/cache").Methods(http.MethodGet).Handler(view)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fail(err)
	}
	if *addrFile != "" {
		tmp := *addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()), 0o644); err != nil {
			fail(err)
		}
		if err := os.Rename(tmp, *addrFile); err != nil {
			fail(err)
		}
	}
	fmt.Fprintf(os.Stderr, "upstream-cloudconfig: serving on %s\n", ln.Addr())
	srv := &http.Server{Handler: m}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "upstream-cloudconfig: %v\n", err)
	os.Exit(1)
}
