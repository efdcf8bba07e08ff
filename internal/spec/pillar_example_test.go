package spec

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestPillarExampleVolumesAreValid: every volume salt/pillar.example
// shows is one the node accepts as it stands, once its pillar key is its
// name (as the Salt module makes it).
func TestPillarExampleVolumesAreValid(t *testing.T) {
	raw, err := os.ReadFile("../../salt/pillar.example")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		SaltVolumes struct {
			Volumes map[string]map[string]any `yaml:"volumes"`
		} `yaml:"salt_volumes"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("salt/pillar.example is not YAML: %v", err)
	}
	if len(doc.SaltVolumes.Volumes) < 3 {
		t.Fatalf("salt/pillar.example shows %d volumes; it should show one of each kind", len(doc.SaltVolumes.Volumes))
	}
	kinds := map[string]bool{}
	for name, v := range doc.SaltVolumes.Volumes {
		v["name"] = name
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Parse(bytes.NewReader(b))
		if err != nil {
			t.Errorf("salt/pillar.example: volume %s: %v", name, err)
			continue
		}
		kinds[s.Type()] = true
	}
	if len(kinds) < 3 {
		t.Errorf("salt/pillar.example shows the kinds %v; show sparse, raw and LVM", kinds)
	}
}
