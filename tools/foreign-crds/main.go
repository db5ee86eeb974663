// Command foreign-crds writes the definitions of the kinds harvester-cloud reads but does not own,
// as their upstreams define them, for the tests' control planes:
//
//	foreign-crds crds DIR
//	    KubeVirt's VirtualMachine, VirtualMachineInstance and VirtualMachineInstanceMigration CRDs,
//	    made by virt-operator's own generator (with KubeVirt's validation schemas), and the
//	    NetworkAttachmentDefinition CRD that network-attachment-definition-client ships, one JSON
//	    file per CRD named after it (<plural>.<group>.json).
//
//	foreign-crds vmi [flags]
//	    A VirtualMachineInstance as KubeVirt writes it, built from kubevirt.io/api's Go types and
//	    printed as JSON: what a test creates when it needs a VMI, so that the fields are KubeVirt's
//	    by construction.
//
//	foreign-crds vm [flags]
//	    A VirtualMachine (running, with a minimal template), built the same way.
//
//	foreign-crds nad [flags]
//	    A NetworkAttachmentDefinition, built from network-attachment-definition-client's Go types.
//
// It is test tooling: scripts/control-plane.sh builds it, runs `crds` into its cache, and `up`
// copies the result into each control plane's directory.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"sigs.k8s.io/yaml"
)

// The module whose artifacts/ holds the NetworkAttachmentDefinition CRD (it ships the file, not
// code that makes it).
const nadModule = "github.com/k8snetworkplumbingwg/network-attachment-definition-client"

// What this program reads from the module: the v1 CRD, the one Multus installs.
const nadCRDFile = "artifacts/networks-crd.yaml"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "crds":
		if len(os.Args) != 3 {
			usage()
		}
		err = writeCRDs(os.Args[2])
	case "vmi":
		err = writeVMI(os.Args[2:])
	case "vm":
		err = writeVM(os.Args[2:])
	case "nad":
		err = writeNAD(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "foreign-crds: %v\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: foreign-crds crds DIR | foreign-crds vmi|vm|nad [flags] (foreign-crds vmi -h)")
	os.Exit(2)
}

func writeCRDs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, make := range []func() (*extv1.CustomResourceDefinition, error){
		components.NewVirtualMachineCrd,
		components.NewVirtualMachineInstanceCrd,
		components.NewVirtualMachineInstanceMigrationCrd,
	} {
		crd, err := make()
		if err != nil {
			return fmt.Errorf("KubeVirt's generator: %w", err)
		}
		if err := writeCRD(dir, crd); err != nil {
			return err
		}
	}
	nad, err := nadCRD()
	if err != nil {
		return err
	}
	return writeCRD(dir, nad)
}

// nadCRD reads the NetworkAttachmentDefinition CRD from the module this program was built with,
// found in the module cache (downloaded again if the cache was cleaned).
func nadCRD() (*extv1.CustomResourceDefinition, error) {
	version, err := dependencyVersion(nadModule)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("go", "mod", "download", "-json", nadModule+"@"+version).Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download %s@%s: %w", nadModule, version, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, fmt.Errorf("go mod download %s@%s: %w", nadModule, version, err)
	}
	if mod.Error != "" || mod.Dir == "" {
		return nil, fmt.Errorf("go mod download %s@%s: %s", nadModule, version, mod.Error)
	}
	path := filepath.Join(mod.Dir, nadCRDFile)
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var crd extv1.CustomResourceDefinition
	// Strict: a field this version of apiextensions does not know means the file is not what we
	// take it for.
	if err := yaml.UnmarshalStrict(text, &crd); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if crd.Spec.Names.Kind != "NetworkAttachmentDefinition" {
		return nil, fmt.Errorf("%s: a CRD of %q, not NetworkAttachmentDefinition", path, crd.Spec.Names.Kind)
	}
	return &crd, nil
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
func writeCRD(dir string, crd *extv1.CustomResourceDefinition) error {
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
	}
	out, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, crd.Name+".json"), append(out, '\n'), 0o644)
}

// repeated collects a flag given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func writeVMI(args []string) error {
	fs := flag.NewFlagSet("vmi", flag.ContinueOnError)
	name := fs.String("name", "", "metadata.name (required)")
	namespace := fs.String("namespace", "default", "metadata.namespace")
	phase := fs.String("phase", string(kubevirtv1.Running), "status.phase")
	migrating := fs.Bool("migrating", false, "status.migrationState: a migration under way")
	var labels, ifaces repeated
	fs.Var(&labels, "label", "KEY=VALUE, a label (repeatable)")
	fs.Var(&ifaces, "interface", "NAME[=NETWORK][:IP,IP...][@GUEST-IFACE]: a network and its interface "+
		"(repeatable, in order); NETWORK ns/name makes it a Multus network, none the pod network; the "+
		"first IP is the interface's ipAddress, all are its ipAddresses")
	err := fs.Parse(args)
	if err != nil {
		return err
	}
	if *name == "" || fs.NArg() != 0 {
		return errors.New("vmi: -name is required, and no arguments besides the flags")
	}
	vmi := kubevirtv1.VirtualMachineInstance{
		TypeMeta: metav1.TypeMeta{
			APIVersion: kubevirtv1.GroupVersion.String(),
			Kind:       kubevirtv1.VirtualMachineInstanceGroupVersionKind.Kind,
		},
		ObjectMeta: metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Status:     kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.VirtualMachineInstancePhase(*phase)},
	}
	if vmi.Labels, err = keyValues(labels); err != nil {
		return err
	}
	for _, spec := range ifaces {
		if err := addInterface(&vmi, spec); err != nil {
			return err
		}
	}
	if *migrating {
		vmi.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
			MigrationUID: "migration-under-way",
		}
	}
	return printObject(&vmi)
}

func writeVM(args []string) error {
	fs := flag.NewFlagSet("vm", flag.ContinueOnError)
	name := fs.String("name", "", "metadata.name (required)")
	namespace := fs.String("namespace", "default", "metadata.namespace")
	var labels, annotations repeated
	fs.Var(&labels, "label", "KEY=VALUE, a label (repeatable)")
	fs.Var(&annotations, "annotation", "KEY=VALUE, an annotation (repeatable)")
	err := fs.Parse(args)
	if err != nil {
		return err
	}
	if *name == "" || fs.NArg() != 0 {
		return errors.New("vm: -name is required, and no arguments besides the flags")
	}
	always := kubevirtv1.RunStrategyAlways
	vm := kubevirtv1.VirtualMachine{
		TypeMeta: metav1.TypeMeta{
			APIVersion: kubevirtv1.GroupVersion.String(),
			Kind:       kubevirtv1.VirtualMachineGroupVersionKind.Kind,
		},
		ObjectMeta: metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Networks: []kubevirtv1.Network{*kubevirtv1.DefaultPodNetwork()},
				},
			},
		},
	}
	vm.Spec.Template.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{
		*kubevirtv1.DefaultMasqueradeNetworkInterface(),
	}
	if vm.Labels, err = keyValues(labels); err != nil {
		return err
	}
	if vm.Annotations, err = keyValues(annotations); err != nil {
		return err
	}
	return printObject(&vm)
}

func writeNAD(args []string) error {
	fs := flag.NewFlagSet("nad", flag.ContinueOnError)
	name := fs.String("name", "", "metadata.name (required)")
	namespace := fs.String("namespace", "default", "metadata.namespace")
	config := fs.String("config", "", "spec.config, the CNI configuration (JSON text, kept as given)")
	var labels repeated
	fs.Var(&labels, "label", "KEY=VALUE, a label (repeatable)")
	err := fs.Parse(args)
	if err != nil {
		return err
	}
	if *name == "" || fs.NArg() != 0 {
		return errors.New("nad: -name is required, and no arguments besides the flags")
	}
	nad := nadv1.NetworkAttachmentDefinition{
		TypeMeta: metav1.TypeMeta{
			APIVersion: nadv1.SchemeGroupVersion.String(),
			Kind:       "NetworkAttachmentDefinition",
		},
		ObjectMeta: metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: *config},
	}
	if nad.Labels, err = keyValues(labels); err != nil {
		return err
	}
	return printObject(&nad)
}

// keyValues reads KEY=VALUE pairs; none gives nil (no field).
func keyValues(pairs []string) (map[string]string, error) {
	var out map[string]string
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not KEY=VALUE", p)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out, nil
}

// printObject prints obj as one line of JSON, as a client would send it.
func printObject(obj any) error {
	out, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		return err
	}
	// The API server sets creationTimestamp; a null one is not what a client sends (and the
	// template's is not either).
	dropNullTimestamps(m)
	return json.NewEncoder(os.Stdout).Encode(m)
}

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

// addInterface adds one network to the spec (network and domain interface, as KubeVirt pairs them
// by name) and, when it has addresses or a guest interface name, its status interface.
func addInterface(vmi *kubevirtv1.VirtualMachineInstance, spec string) error {
	rest, guest, _ := strings.Cut(spec, "@")
	rest, ips, _ := strings.Cut(rest, ":")
	name, network, multus := strings.Cut(rest, "=")
	if name == "" {
		return fmt.Errorf("vmi: -interface %q has no name", spec)
	}
	nw := kubevirtv1.Network{Name: name}
	iface := kubevirtv1.Interface{Name: name}
	if multus {
		nw.Multus = &kubevirtv1.MultusNetwork{NetworkName: network}
		iface.Bridge = &kubevirtv1.InterfaceBridge{}
	} else {
		nw.Pod = &kubevirtv1.PodNetwork{}
		iface.Masquerade = &kubevirtv1.InterfaceMasquerade{}
	}
	vmi.Spec.Networks = append(vmi.Spec.Networks, nw)
	vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces, iface)
	if ips == "" && guest == "" {
		return nil
	}
	status := kubevirtv1.VirtualMachineInstanceNetworkInterface{
		Name:          name,
		InterfaceName: guest,
		// What virt-handler writes when both libvirt and the guest agent report the interface.
		InfoSource: "domain, guest-agent",
	}
	if ips != "" {
		for _, ip := range strings.Split(ips, ",") {
			if net.ParseIP(ip) == nil {
				return fmt.Errorf("vmi: -interface %q: %q is not an IP address", spec, ip)
			}
			status.IPs = append(status.IPs, ip)
		}
		// KubeVirt's rule: the interface's IP is the first of its IPs.
		status.IP = status.IPs[0]
	}
	vmi.Status.Interfaces = append(vmi.Status.Interfaces, status)
	return nil
}
