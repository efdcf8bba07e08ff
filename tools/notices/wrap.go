package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// artifact is what a wrapping SBOM describes: a package, an image or a
// wheel of ours.
type artifact struct {
	Type, Name, Version, Purl string
}

// wrap writes to out a CycloneDX 1.6 SBOM of an artifact of ours (a
// .deb, an .rpm, serve's image, the Salt extension's wheel) that carries
// the binaries whose SBOMs (as make dist writes them, licences in) are
// from: the artifact is the SBOM's subject, under our licence (LICENSE in
// ours), and what it carries (each binary and the modules it links) are
// its components, each once. A wheel carries no binary: no component. The
// same bytes for the same input.
func wrap(out string, a artifact, ours string, from []string) error {
	if a.Name == "" || a.Version == "" || a.Purl == "" || a.Type == "" {
		return fmt.Errorf("-wrap needs -type, -name, -version and -purl")
	}
	own, err := moduleLicence(ours)
	if err != nil {
		return fmt.Errorf("this repository's licence: %w", err)
	}
	root := map[string]any{"bom-ref": a.Purl, "type": a.Type, "name": a.Name, "version": a.Version, "purl": a.Purl,
		"licenses": []any{map[string]any{"license": map[string]any{"id": own}}}}
	var comps, deps []any
	seen := map[string]bool{}
	var carried []any
	for _, f := range from {
		bom, err := readBOM(f)
		if err != nil {
			return err
		}
		meta, _ := bom["metadata"].(map[string]any)
		bin, _ := meta["component"].(map[string]any)
		if bin == nil {
			return fmt.Errorf("%s: no metadata.component (the binary)", f)
		}
		list, _ := bom["components"].([]any)
		for _, x := range append([]any{bin}, list...) {
			c, _ := x.(map[string]any)
			ref, _ := c["bom-ref"].(string)
			if ref == "" {
				return fmt.Errorf("%s: a component without bom-ref", f)
			}
			if _, ok := c["licenses"]; !ok {
				return fmt.Errorf("%s: component %s without a licence (run notices -sbom on it first)", f, ref)
			}
			if ref == bin["bom-ref"] && !seen[ref] {
				carried = append(carried, ref)
			}
			if !seen[ref] {
				seen[ref] = true
				comps = append(comps, c)
			}
		}
		dl, _ := bom["dependencies"].([]any)
		for _, x := range dl {
			dep, _ := x.(map[string]any)
			ref, _ := dep["ref"].(string)
			if ref != "" && !seen["dep "+ref] {
				seen["dep "+ref] = true
				deps = append(deps, dep)
			}
		}
	}
	deps = append([]any{map[string]any{"ref": a.Purl, "dependsOn": append([]any{}, carried...)}}, deps...)
	bom := map[string]any{
		"$schema":     "http://cyclonedx.org/schema/bom-1.6.schema.json",
		"bomFormat":   "CycloneDX",
		"specVersion": "1.6",
		"version":     1,
		"metadata": map[string]any{
			"tools":     map[string]any{"components": []any{map[string]any{"type": "application", "name": "salt-volumes tools/notices"}}},
			"component": root,
		},
		"components":   comps,
		"dependencies": deps,
	}
	if len(comps) == 0 {
		delete(bom, "components")
	}
	data, err := json.MarshalIndent(bom, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// splitList is a comma-separated flag's values.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
