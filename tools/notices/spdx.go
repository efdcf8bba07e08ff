package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The licences the modules we link are under, told apart by a phrase of
// each that no other of them carries (matched in lower case, whitespace
// folded). A licence file that matches none fails the run: a new
// module's terms are read by a person, and a rule added here, before
// the SBOM names them.
var licenceRules = []struct {
	id      string
	matches func(t string) bool
}{
	{"Apache-2.0", func(t string) bool {
		return strings.Contains(t, "apache license") && strings.Contains(t, "version 2.0")
	}},
	{"MPL-2.0", func(t string) bool {
		return strings.Contains(t, "mozilla public license") && strings.Contains(t, "2.0")
	}},
	{"MIT", func(t string) bool {
		return strings.Contains(t, "permission is hereby granted, free of charge, to any person")
	}},
	{"ISC", func(t string) bool {
		return strings.Contains(t, "distribute this software for any purpose with or without fee is hereby granted")
	}},
	// BSD: three clauses when one forbids using the names to endorse.
	{"BSD-3-Clause", func(t string) bool {
		return strings.Contains(t, "redistribution and use in source and binary forms") && strings.Contains(t, "to endorse or promote products")
	}},
	{"BSD-2-Clause", func(t string) bool {
		return strings.Contains(t, "redistribution and use in source and binary forms") && !strings.Contains(t, "to endorse or promote products")
	}},
}

// classify names the licences a licence file's text holds, as SPDX ids
// (a file may hold several: yaml.v3's MIT and Apache-2.0 parts).
func classify(text []byte) []string {
	t := strings.Join(strings.Fields(string(bytes.ToLower(text))), " ")
	var ids []string
	for _, r := range licenceRules {
		if r.matches(t) {
			ids = append(ids, r.id)
		}
	}
	return ids
}

// moduleLicence is the SPDX expression of the licence files at a
// module's root (dir): every licence they hold, joined with AND (each
// applies to a part of the module, or all of it).
func moduleLicence(dir string) (string, error) {
	// The root's files only: a subdirectory's are of code carried from
	// elsewhere, which the notices carry.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	seen := map[string]bool{}
	for _, e := range ents {
		n := e.Name()
		low := strings.ToLower(n)
		if !e.Type().IsRegular() || !licenceFile.MatchString(n) || !strings.HasPrefix(low, "licen") && !strings.HasPrefix(low, "copying") {
			continue // NOTICE, PATENTS: no licence of their own
		}
		body, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		ids := classify(body)
		if len(ids) == 0 {
			return "", fmt.Errorf("%s: no licence tools/notices knows (spdx.go): read it, and add its rule", filepath.Join(dir, n))
		}
		for _, id := range ids {
			seen[id] = true
		}
	}
	if len(seen) == 0 {
		return "", fmt.Errorf("%s: no licence file at its root", dir)
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return strings.Join(ids, " AND "), nil
}
