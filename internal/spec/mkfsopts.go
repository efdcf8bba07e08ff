package spec

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// mkfsOption is one option a user may pass to mkfs. Only options that tune
// the filesystem being made are allowed: nothing that reads or writes
// another path (-d, -J device=, -d file,name=), skips or fakes the write
// (-n, -N, -S), moves the filesystem inside the device (-E offset=), forces
// past mkfs's own checks (-F, -f) or replaces the UUID we stamp.
type mkfsOption struct {
	takesArg bool
	// subopts, when set, restricts a comma-separated argument to these
	// names (name or name=value).
	subopts map[string]bool
	// check validates a plain argument; nil means any safe value.
	check func(string) error
}

var (
	// Compiled on first use: most specs have no mkfs options, and every
	// salt-volume-exec run would pay for them at start.
	numberRE  = lazyRE(`^[0-9]+$`)
	decimalRE = lazyRE(`^[0-9]+(\.[0-9]+)?$`)
	// A sub-option value: sizes, numbers, booleans, uid:gid, encodings.
	subValueRE = lazyRE(`^[A-Za-z0-9_.:+-]*$`)
	wordsRE    = lazyRE(`^[a-z0-9_^]+(,[a-z0-9_^]+)*$`)
)

func number(v string) error {
	if !numberRE().MatchString(v) {
		return fmt.Errorf("%q is not a whole number", v)
	}
	return nil
}

func oneOf(vals ...string) func(string) error {
	return func(v string) error {
		for _, x := range vals {
			if v == x {
				return nil
			}
		}
		return fmt.Errorf("%q is not one of %s", v, strings.Join(vals, ", "))
	}
}

func label(max int) func(string) error {
	return func(v string) error {
		if len(v) > max {
			return fmt.Errorf("label %q is longer than %d bytes", v, max)
		}
		return nil
	}
}

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// From mke2fs(8), e2fsprogs 1.47.
var ext4Options = map[string]mkfsOption{
	"-b": {takesArg: true, check: number},
	"-C": {takesArg: true, check: number},
	"-e": {takesArg: true, check: oneOf("continue", "remount-ro", "panic")},
	"-E": {takesArg: true, subopts: set("stride", "stripe_width", "stripe-width", "resize",
		"lazy_itable_init", "lazy_journal_init", "packed_meta_blocks", "root_owner", "discard",
		"nodiscard", "num_backup_sb", "quotatype", "assume_storage_prezeroed", "encoding",
		"encoding_flags", "orphan_file_size")},
	"-g": {takesArg: true, check: number},
	"-G": {takesArg: true, check: number},
	"-i": {takesArg: true, check: number},
	"-I": {takesArg: true, check: number},
	"-j": {},
	"-J": {takesArg: true, subopts: set("size", "fast_commit_size")},
	"-L": {takesArg: true, check: label(16)},
	"-m": {takesArg: true, check: func(v string) error {
		if !decimalRE().MatchString(v) {
			return fmt.Errorf("%q is not a percentage", v)
		}
		return nil
	}},
	"-N": {takesArg: true, check: number},
	"-O": {takesArg: true, check: func(v string) error {
		if !wordsRE().MatchString(v) {
			return fmt.Errorf("%q is not a comma-separated list of feature names", v)
		}
		for _, f := range strings.Split(v, ",") {
			if f == "journal_dev" || f == "none" {
				return fmt.Errorf("feature %q would not make an ext4 filesystem", f)
			}
		}
		return nil
	}},
	"-T": {takesArg: true, check: func(v string) error {
		if !wordsRE().MatchString(v) || strings.Contains(v, "^") {
			return fmt.Errorf("%q is not a usage type such as huge or largefile", v)
		}
		return nil
	}},
}

// From mkfs.xfs(8), xfsprogs 6.1.
var xfsOptions = map[string]mkfsOption{
	"-b": {takesArg: true, subopts: set("size")},
	"-m": {takesArg: true, subopts: set("crc", "finobt", "rmapbt", "reflink", "inobtcount", "bigtime")},
	"-d": {takesArg: true, subopts: set("agcount", "agsize", "su", "sunit", "sw", "swidth", "noalign",
		"cowextsize", "extszinherit", "daxinherit", "projinherit")},
	"-i": {takesArg: true, subopts: set("size", "perblock", "maxpct", "align", "attr", "projid32bit", "sparse", "nrext64")},
	"-l": {takesArg: true, subopts: set("size", "version", "sunit", "su", "lazy-count")},
	"-n": {takesArg: true, subopts: set("size", "version", "ftype")},
	"-s": {takesArg: true, subopts: set("size")},
	"-L": {takesArg: true, check: label(12)},
}

// FSLabel is the filesystem label mkfsOptions give (-L), "" for none.
func (s *Spec) FSLabel() string {
	for i, o := range s.MkfsOptions {
		switch {
		case o == "-L" && i+1 < len(s.MkfsOptions):
			return s.MkfsOptions[i+1]
		case strings.HasPrefix(o, "-L") && len(o) > 2:
			return o[2:]
		}
	}
	return ""
}

// MkfsOptionNames lists the allowed options of a filesystem, for messages
// and documentation.
func MkfsOptionNames(fsType string) []string {
	table := ext4Options
	if fsType == FSXFS {
		table = xfsOptions
	}
	names := make([]string, 0, len(table))
	for n := range table {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := strings.ToLower(names[i]), strings.ToLower(names[j])
		if a == b {
			return names[i] > names[j] // -b before -B
		}
		return a < b
	})
	return names
}

// checkMkfsOptions accepts only options from the filesystem's allow-list,
// each as "-X value" (two elements) or "-Xvalue"; no bundled flags and no
// positional arguments (mkfs would take one as the device or its size).
func checkMkfsOptions(fsType string, opts []string) error {
	table := ext4Options
	if fsType == FSXFS {
		table = xfsOptions
	}
	allowed := strings.Join(MkfsOptionNames(fsType), " ")
	for i := 0; i < len(opts); i++ {
		o := opts[i]
		field := fmt.Sprintf("mkfsOptions[%d]", i)
		if strings.ContainsAny(o, "\n\x00") {
			return &FieldError{field, "contains a newline or NUL byte"}
		}
		if o == "" {
			return &FieldError{field, "empty option: remove it"}
		}
		if len(o) < 2 || o[0] != '-' || o[1] == '-' {
			return &FieldError{field, fmt.Sprintf("%q is not an option: mkfsOptions holds options only, never a path or other positional argument (allowed for %s: %s)", o, fsType, allowed)}
		}
		name, attached := o[:2], o[2:]
		spec, ok := table[name]
		if !ok {
			return &FieldError{field, fmt.Sprintf("%s is not allowed for %s: %s (allowed: %s)", name, fsType, whyRefused(fsType, name), allowed)}
		}
		if !spec.takesArg {
			if attached != "" {
				return &FieldError{field, fmt.Sprintf("%q: give one option per element (write %q)", o, name)}
			}
			continue
		}
		val := attached
		if val == "" {
			if i+1 >= len(opts) {
				return &FieldError{field, fmt.Sprintf("%s needs a value: add it as the next element", name)}
			}
			i++
			val = opts[i]
			field = fmt.Sprintf("mkfsOptions[%d]", i)
		}
		if err := spec.checkValue(val); err != nil {
			return &FieldError{field, fmt.Sprintf("%s %s", name, err)}
		}
	}
	return nil
}

func (m mkfsOption) checkValue(v string) error {
	if v == "" {
		return fmt.Errorf("needs a value")
	}
	if m.subopts == nil {
		if m.check != nil {
			return m.check(v)
		}
		return nil
	}
	for _, part := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(part, "=")
		if k == "uuid" {
			return fmt.Errorf("uuid= would replace the filesystem UUID, which must be the volume UUID")
		}
		if !m.subopts[k] {
			names := make([]string, 0, len(m.subopts))
			for n := range m.subopts {
				names = append(names, n)
			}
			sort.Strings(names)
			return fmt.Errorf("sub-option %q is not allowed (allowed: %s)", k, strings.Join(names, ", "))
		}
		if !subValueRE().MatchString(val) {
			return fmt.Errorf("value %q of %s is not a plain number or word", val, k)
		}
	}
	return nil
}

// whyRefused explains the options people are most likely to try.
func whyRefused(fsType, name string) string {
	switch name {
	case "-U":
		return "the filesystem UUID must be the volume UUID"
	case "-F", "-f":
		return "forcing past mkfs's own checks is never needed: salt-volumes only formats blank devices"
	case "-n", "-N":
		return "a dry run would leave the volume without a filesystem"
	case "-d":
		if fsType == FSExt4 {
			return "it copies a host directory into the filesystem"
		}
	case "-p":
		return "a protofile copies host files into the filesystem"
	case "-S":
		return "it rewrites only the superblock of an existing filesystem"
	case "-t":
		return "fsType chooses the filesystem"
	case "-r":
		if fsType == FSXFS {
			return "a realtime section names another device"
		}
	}
	return "only options that tune the filesystem are passed to mkfs"
}

func lazyRE(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
