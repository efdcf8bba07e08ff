package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// readBOM reads a CycloneDX SBOM as a tree, its numbers kept as written
// so that a rewrite changes only what we set.
func readBOM(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var bom map[string]any
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	if err := d.Decode(&bom); err != nil {
		return nil, fmt.Errorf("%s: not JSON: %w", path, err)
	}
	if bom["bomFormat"] != "CycloneDX" {
		return nil, fmt.Errorf("%s: not a CycloneDX SBOM", path)
	}
	return bom, nil
}

// addLicences writes into a CycloneDX SBOM (cyclonedx-gomod's, whose own
// licence detection names several of our modules' licences wrongly) the
// licence of each Go module it lists, read from the module cache by
// moduleLicence, and ours (LICENSE in dir, this repository's) for the
// main component. The file is rewritten in place, the same bytes for the
// same input.
func addLicences(path, modcache, ours string) error {
	bom, err := readBOM(path)
	if err != nil {
		return err
	}
	own, err := moduleLicence(ours)
	if err != nil {
		return fmt.Errorf("this repository's licence: %w", err)
	}
	set := func(c map[string]any, expr string) {
		if strings.Contains(expr, " ") {
			c["licenses"] = []any{map[string]any{"expression": expr}}
		} else {
			c["licenses"] = []any{map[string]any{"license": map[string]any{"id": expr}}}
		}
	}
	if meta, ok := bom["metadata"].(map[string]any); ok {
		if c, ok := meta["component"].(map[string]any); ok {
			set(c, own)
		}
	}
	comps, _ := bom["components"].([]any)
	for _, x := range comps {
		c, ok := x.(map[string]any)
		if !ok {
			continue
		}
		name, _ := c["name"].(string)
		version, _ := c["version"].(string)
		purl, _ := c["purl"].(string)
		if !strings.HasPrefix(purl, "pkg:golang/") || name == "" || version == "" {
			return fmt.Errorf("%s: component %q %q is not a Go module (purl %q)", path, name, version, purl)
		}
		dir := filepath.Join(modcache, escape(name)+"@"+escape(version))
		if _, err := os.Stat(dir); err != nil {
			return fmt.Errorf("module %s %s is not in the module cache (%s): run go mod download first", name, version, dir)
		}
		expr, err := moduleLicence(dir)
		if err != nil {
			return fmt.Errorf("module %s %s: %w", name, version, err)
		}
		set(c, expr)
	}
	out, err := json.MarshalIndent(bom, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(out, '\n'), 0o644)
}
