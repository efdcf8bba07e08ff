package spec

import (
	"fmt"
	"maps"
	"sort"
	"strings"
)

// Template is what a volume's PersistentVolume carries besides what
// salt-volumes puts there (Kubernetes mode; MetalK8s's template.metadata).
// The node binary accepts and ignores it.
type Template struct {
	Metadata TemplateMetadata `json:"metadata"`
}

// TemplateMetadata holds the PV's extra labels and annotations.
type TemplateMetadata struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// maxAnnotationBytes is the API server's limit on a PV's annotations,
// keys and values together.
const maxAnnotationBytes = 256 << 10

// reserved names the keys a template may not set: those salt-volumes and
// Kubernetes' PV controller write, and by which they recognise a PV (a
// template setting salt-volumes.io/uuid could make someone else's PV look
// like ours).
func reserved(key string, label bool) string {
	switch {
	case strings.HasPrefix(key, "salt-volumes.io/"):
		return "salt-volumes.io/ keys are set by salt-volumes itself"
	case label && key == "app.kubernetes.io/managed-by":
		return "salt-volumes sets it (it marks the PVs it manages)"
	case !label && strings.HasPrefix(key, "pv.kubernetes.io/"):
		return "pv.kubernetes.io/ annotations belong to Kubernetes' PV controller"
	}
	return ""
}

// validate checks labels and annotations as the API server would (a PV
// refused there would leave the volume Pending), in a stable order so the
// first error is the same every time.
func (t *Template) validate() error {
	if t == nil {
		return nil
	}
	m := t.Metadata
	for _, k := range sortedKeys(m.Labels) {
		field := fmt.Sprintf("template.metadata.labels[%q]", k)
		if err := qualifiedName(k); err != "" {
			return &FieldError{field, "the key " + err}
		}
		if why := reserved(k, true); why != "" {
			return &FieldError{field, why + ": drop this label"}
		}
		if v := m.Labels[k]; !labelValue(v) {
			return &FieldError{field, fmt.Sprintf("value %q is not a label value: use at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit (or an empty value)", v)}
		}
	}
	size := 0
	for _, k := range sortedKeys(m.Annotations) {
		field := fmt.Sprintf("template.metadata.annotations[%q]", k)
		if err := qualifiedName(k); err != "" {
			return &FieldError{field, "the key " + err}
		}
		if why := reserved(k, false); why != "" {
			return &FieldError{field, why + ": drop this annotation"}
		}
		size += len(k) + len(m.Annotations[k])
	}
	if size > maxAnnotationBytes {
		return &FieldError{"template.metadata.annotations", fmt.Sprintf("%d bytes in all: Kubernetes takes at most %d", size, maxAnnotationBytes)}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// qualifiedName checks a label or annotation key: an optional DNS-1123
// subdomain prefix and '/', then a name of at most 63 characters. It
// returns what is wrong, or "".
func qualifiedName(k string) string {
	prefix, name, slashed := strings.Cut(k, "/")
	if !slashed {
		prefix, name = "", k
	} else if !dns1123Subdomain(prefix) {
		return fmt.Sprintf("%q has a prefix that is not a DNS subdomain: use lowercase letters, digits, '-' and '.' before the '/' (e.g. example.com/tier)", k)
	}
	if !labelValue(name) || name == "" {
		return fmt.Sprintf("%q is not a qualified name: use at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit, optionally after a prefix and '/'", k)
	}
	return ""
}

// labelValue: empty, or at most 63 alphanumerics, '-', '_', '.', with an
// alphanumeric at each end.
func labelValue(v string) bool {
	if v == "" {
		return true
	}
	if len(v) > 63 || !alnum(v[0]) || !alnum(v[len(v)-1]) {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }

// dns1123Subdomain: at most 253 characters of dot-separated DNS-1123
// labels.
func dns1123Subdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if !dns1123Label(part) || len(part) > 63 {
			return false
		}
	}
	return true
}

// Clone copies t deeply (nil stays nil).
func (t *Template) Clone() *Template {
	if t == nil {
		return nil
	}
	return &Template{Metadata: TemplateMetadata{Labels: maps.Clone(t.Metadata.Labels), Annotations: maps.Clone(t.Metadata.Annotations)}}
}
