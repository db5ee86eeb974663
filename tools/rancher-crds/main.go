// Command rancher-crds writes the definitions of Rancher's kinds that harvester-cloud reads or
// writes, each made by the Rancher code that installs it, at the Rancher that Harvester v1.8.0
// pins (github.com/rancher/rancher 07a90f09a491, served by the Go module proxy at that
// pseudo-version only):
//
//	rancher-crds DIR
//
// writes one JSON file per CRD into DIR, named <plural>.<group>.json (below), and
//
//	rancher-crds object < OBJECT.json
//
// reads one object of those kinds (a test's fixture), decodes it strictly into Rancher's Go type of
// its kind (an unknown field or a wrong type is an error) and prints it as that type encodes it. Token
// and the cluster.cattle.io kinds have no schema for the API server to prune a wrong field with, so
// this is what holds a test's fixture to Rancher's field names.
//
// The CRDs:
//
//   - globalrolebindings.management.cattle.io: Rancher's generated CRD
//     (pkg/crds/yaml/generated in github.com/rancher/rancher, read from the module cache), which
//     Rancher's pkg/crds installs;
//   - apiservices.management.cattle.io: wrangler's crd.CRD from pkg/apis' APIService struct,
//     cluster-scoped, with a status subresource, as Rancher's pkg/crds/dashboard declares it;
//   - tokens.management.cattle.io, clusterauthtokens.cluster.cattle.io and
//     clusteruserattributes.cluster.cattle.io: what norman's store/crd Factory creates for them
//     (Rancher's auth setup and the cluster agent call it): a catch-all schema and no status
//     subresource. The Factory runs here against a fake API server that records what it creates.
//
// It is test tooling: scripts/control-plane.sh builds it beside tools/foreign-crds and puts its
// CRDs with theirs, which every test control plane gets in DIR/foreign/crds.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"strings"
	"time"

	normancrd "github.com/rancher/norman/store/crd"
	"github.com/rancher/norman/types"
	clusterv3 "github.com/rancher/rancher/pkg/apis/cluster.cattle.io/v3"
	mgmtv3 "github.com/rancher/rancher/pkg/apis/management.cattle.io/v3"
	wranglercrd "github.com/rancher/wrangler/v3/pkg/crd"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/fake"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ktesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"
)

// The module of pkg/apis; its main module (same version) holds the generated CRDs.
const (
	apisModule    = "github.com/rancher/rancher/pkg/apis"
	rancherModule = "github.com/rancher/rancher"
	grbFile       = "pkg/crds/yaml/generated/management.cattle.io_globalrolebindings.yaml"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: rancher-crds DIR | rancher-crds object < OBJECT.json")
		os.Exit(2)
	}
	run := writeCRDs
	if os.Args[1] == "object" {
		run = func(string) error { return object(os.Stdin, os.Stdout) }
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "rancher-crds: %v\n", err)
		os.Exit(1)
	}
}

// Rancher's Go type of each kind a fixture may be.
var kinds = map[string]func() any{
	"management.cattle.io/v3 Token":             func() any { return &mgmtv3.Token{} },
	"management.cattle.io/v3 GlobalRoleBinding": func() any { return &mgmtv3.GlobalRoleBinding{} },
	"management.cattle.io/v3 APIService":        func() any { return &mgmtv3.APIService{} },
	"cluster.cattle.io/v3 ClusterAuthToken":     func() any { return &clusterv3.ClusterAuthToken{} },
	"cluster.cattle.io/v3 ClusterUserAttribute": func() any { return &clusterv3.ClusterUserAttribute{} },
}

func object(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	var head struct{ APIVersion, Kind string }
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf("object: %w", err)
	}
	make, ok := kinds[head.APIVersion+" "+head.Kind]
	if !ok {
		return fmt.Errorf("object: %s %s is none of Rancher's kinds this tool knows", head.APIVersion, head.Kind)
	}
	obj := make()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return fmt.Errorf("object: not a Rancher %s: %w", head.Kind, err)
	}
	encoded, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var given, m map[string]any
	if err := json.Unmarshal(raw, &given); err != nil {
		return err
	}
	if err := json.Unmarshal(encoded, &m); err != nil {
		return err
	}
	if err := exactKeys(given, reflect.TypeOf(obj), ""); err != nil {
		return fmt.Errorf("object: not a Rancher %s: %w", head.Kind, err)
	}
	dropNullTimestamps(m)
	return json.NewEncoder(out).Encode(m)
}

// exactKeys fails on a key of given that no field of t has as its JSON name, spelt exactly
// (encoding/json matches names without regard to case; Kubernetes does not), walking t's structs,
// maps and slices alongside given. A type that decodes itself (times, quantities) is not walked.
func exactKeys(given any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := given.(map[string]any)
		if !ok {
			return nil // a wrong type: the strict decode has said so
		}
		fields := map[string]reflect.Type{}
		jsonFields(t, fields)
		for k, v := range obj {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("unknown field %q", path+k)
			}
			if err := exactKeys(v, ft, path+k+"."); err != nil {
				return err
			}
		}
	case reflect.Map:
		if obj, ok := given.(map[string]any); ok {
			for k, v := range obj {
				if err := exactKeys(v, t.Elem(), path+k+"."); err != nil {
					return err
				}
			}
		}
	case reflect.Slice, reflect.Array:
		if list, ok := given.([]any); ok {
			for i, v := range list {
				if err := exactKeys(v, t.Elem(), fmt.Sprintf("%s%d.", path, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

// jsonFields collects t's fields by their JSON names, those of inlined embedded structs included.
func jsonFields(t reflect.Type, into map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if name == "" && f.Anonymous && ft.Kind() == reflect.Struct {
			jsonFields(ft, into)
			continue
		}
		if name == "" {
			name = f.Name
		}
		into[name] = f.Type
	}
}

// dropNullTimestamps removes the null creationTimestamps of empty ObjectMetas: the API server
// sets them, and a client does not send them.
func dropNullTimestamps(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if k == "creationTimestamp" && x == nil {
				delete(v, k)
				continue
			}
			dropNullTimestamps(x)
		}
	case []any:
		for _, x := range v {
			dropNullTimestamps(x)
		}
	}
}

func writeCRDs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	grb, err := generatedCRD(grbFile, "GlobalRoleBinding")
	if err != nil {
		return err
	}
	apiService, err := wranglercrd.CRD{SchemaObject: &mgmtv3.APIService{}, NonNamespace: true, Status: true}.
		ToCustomResourceDefinition()
	if err != nil {
		return fmt.Errorf("wrangler's CRD of APIService: %w", err)
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(apiService)
	if err != nil {
		return fmt.Errorf("wrangler's CRD of APIService: %w", err)
	}
	var apiServiceCRD apiext.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(content, &apiServiceCRD); err != nil {
		return fmt.Errorf("wrangler's CRD of APIService: %w", err)
	}
	normans, err := normanCRDs()
	if err != nil {
		return err
	}
	for _, crd := range append([]*apiext.CustomResourceDefinition{grb, &apiServiceCRD}, normans...) {
		if err := writeCRD(dir, crd); err != nil {
			return err
		}
	}
	return nil
}

// generatedCRD reads one of Rancher's generated CRDs from its module, at the version of pkg/apis
// this binary was built with (downloaded again if the module cache was cleaned).
func generatedCRD(file, kind string) (*apiext.CustomResourceDefinition, error) {
	version, err := dependencyVersion(apisModule)
	if err != nil {
		return nil, err
	}
	download := exec.Command("go", "mod", "download", "-json", rancherModule+"@"+version)
	// Outside this module: the main module is not a dependency, so its go.sum has no line for it
	// (the checksum database vouches for it instead).
	download.Dir = os.TempDir()
	out, err := download.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download %s@%s: %w", rancherModule, version, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, fmt.Errorf("go mod download %s@%s: %w", rancherModule, version, err)
	}
	if mod.Error != "" || mod.Dir == "" {
		return nil, fmt.Errorf("go mod download %s@%s: %s", rancherModule, version, mod.Error)
	}
	path := filepath.Join(mod.Dir, file)
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var crd apiext.CustomResourceDefinition
	// Strict: a field this version of apiextensions does not know means the file is not what we
	// take it for.
	if err := yaml.UnmarshalStrict(text, &crd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if crd.Spec.Names.Kind != kind {
		return nil, fmt.Errorf("%s: a CRD of %q, not %s", path, crd.Spec.Names.Kind, kind)
	}
	return &crd, nil
}

// normanCRDs runs norman's Factory on the three kinds Rancher gives it, against a fake API server
// that marks each CRD established and keeps it, and returns what the Factory created.
func normanCRDs() ([]*apiext.CustomResourceDefinition, error) {
	// The API versions of Rancher's norman schemas (pkg/schemas/{management,cluster}.cattle.io/v3).
	management := types.APIVersion{Version: "v3", Group: "management.cattle.io", Path: "/v3"}
	cluster := types.APIVersion{Version: "v3", Group: "cluster.cattle.io", Path: "/v3/cluster"}
	schemas := types.NewSchemas()
	schemas.MustImport(&management, mgmtv3.Token{})
	schemas.MustImport(&cluster, clusterv3.ClusterAuthToken{})
	schemas.MustImport(&cluster, clusterv3.ClusterUserAttribute{})
	want := []*types.Schema{
		schemas.Schema(&management, "token"),
		schemas.Schema(&cluster, "clusterAuthToken"),
		schemas.Schema(&cluster, "clusterUserAttribute"),
	}
	for _, s := range want {
		if s == nil {
			return nil, errors.New("norman did not import one of Token, ClusterAuthToken, ClusterUserAttribute")
		}
	}
	server := fake.NewSimpleClientset()
	server.PrependReactor("create", "customresourcedefinitions",
		func(a ktesting.Action) (bool, runtime.Object, error) {
			crd := a.(ktesting.CreateAction).GetObject().(*apiext.CustomResourceDefinition)
			crd.Status.Conditions = []apiext.CustomResourceDefinitionCondition{
				{Type: apiext.Established, Status: apiext.ConditionTrue},
			}
			return false, nil, nil // the tracker stores it
		})
	factory := normancrd.NewFactoryFromClientGetter(fakeGetter{server})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	made, err := factory.CreateCRDs(ctx, types.StorageContext("management"), want...)
	if err != nil {
		return nil, fmt.Errorf("norman's Factory: %w", err)
	}
	out := make([]*apiext.CustomResourceDefinition, 0, len(want))
	for _, s := range want {
		crd, ok := made[s]
		if !ok {
			return nil, fmt.Errorf("norman's Factory made no CRD for %s", s.ID)
		}
		out = append(out, crd.DeepCopy())
	}
	return out, nil
}

// fakeGetter hands norman the fake API server.
type fakeGetter struct{ server clientset.Interface }

func (g fakeGetter) UnversionedClient(*types.APIContext, types.StorageContext) (rest.Interface, error) {
	return nil, errors.New("rancher-crds: no REST client")
}

func (g fakeGetter) APIExtClient(*types.APIContext, types.StorageContext) (clientset.Interface, error) {
	return g.server, nil
}

// dependencyVersion is the version of module this binary was built with (so it is go.sum's).
func dependencyVersion(module string) (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", errors.New("no build information in this binary")
	}
	for _, dep := range info.Deps {
		if dep.Path == module {
			if dep.Replace != nil {
				return dep.Replace.Version, nil
			}
			return dep.Version, nil
		}
	}
	return "", fmt.Errorf("%s is not a dependency of this binary", module)
}

// writeCRD writes crd as JSON, without the status the API server owns.
func writeCRD(dir string, crd *apiext.CustomResourceDefinition) error {
	crd.APIVersion = "apiextensions.k8s.io/v1"
	crd.Kind = "CustomResourceDefinition"
	raw, err := json.Marshal(crd)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return err
	}
	delete(obj, "status")
	if meta, ok := obj["metadata"].(map[string]any); ok {
		delete(meta, "creationTimestamp")
		delete(meta, "resourceVersion")
	}
	out, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, crd.Name+".json"), append(out, '\n'), 0o644)
}
