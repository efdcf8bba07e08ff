package spec

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/google/uuid"
	"go.yaml.in/yaml/v3"
)

// pillarUUID is the uuid the Salt module gives a pillar volume without
// one (salt_volumes.pillar_uuid): a name-based uuid of "pillar/NODE/NAME"
// in a namespace itself named for salt-volumes.io.
func pillarUUID(node, name string) string {
	ns := uuid.NewSHA1(uuid.NameSpaceDNS, []byte("salt-volumes.io"))
	return uuid.NewSHA1(ns, []byte("pillar/"+node+"/"+name)).String()
}

// The module's test (salt/tests) pins the same value: both derive alike.
func TestPillarUUIDAgreesWithTheSaltModule(t *testing.T) {
	if got, want := pillarUUID("node-1", "data-1"), "f71a9971-2168-50f5-8c80-2052a56a21d3"; got != want {
		t.Errorf("pillarUUID(node-1, data-1) = %s, want %s", got, want)
	}
}

// TestPillarExampleVolumesAreValid: every volume salt/pillar.example
// shows is one the node accepts as it stands, once its pillar key is its
// name and, if it has none, its uuid the one derived (as the Salt module
// makes them).
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
		if v["uuid"] == nil {
			// As the module does before asking the node.
			node, _ := v["node"].(string)
			v["uuid"] = pillarUUID(node, name)
		}
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
