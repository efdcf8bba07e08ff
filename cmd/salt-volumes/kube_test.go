package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// #48: a PV printed by salt-volumes pv has no claimRef; in the
// provisioning class any tenant's claim of that class could bind it, so by
// default it goes in the class of operators' volumes, as serve's do.
func TestPrintedPVsAndClassesDefaultToTheStaticClass(t *testing.T) {
	const u = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	v := saltvolumes.View{Spec: spec.Spec{Name: "data-1", UUID: u, Node: "node-1", Mode: spec.ModeFilesystem, FSType: "ext4",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}}
	v.Status.Phase, v.Status.PersistentPath, v.Status.Size = saltvolumes.Available, "/dev/disk/by-uuid/"+u, 1<<30
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/api/v1/volumes/data-1", r.URL.Path)
		require.NoError(t, json.NewEncoder(w).Encode(v))
	}))
	defer srv.Close()
	class := func(args ...string) string {
		var out, errw bytes.Buffer
		require.Equal(t, exitOK, run(args, &out, &errw), errw.String())
		var obj struct {
			Metadata struct{ Name string }
			Spec     struct {
				StorageClassName string `yaml:"storageClassName"`
			}
		}
		require.NoError(t, yaml.Unmarshal(out.Bytes(), &obj), out.String())
		if obj.Spec.StorageClassName != "" {
			return obj.Spec.StorageClassName
		}
		return obj.Metadata.Name
	}
	assert.Equal(t, "salt-volumes-static", class("pv", "--url", srv.URL, "--token", "t", "data-1"))
	assert.Equal(t, "mine", class("pv", "--url", srv.URL, "--token", "t", "--storage-class", "mine", "data-1"))
	assert.Equal(t, "salt-volumes-static", class("storageclass", "--static"), "the class of those PVs")
	assert.Equal(t, "salt-volumes", class("storageclass"), "the provisioning class")
}
