package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/salt-volumes/salt-volumes/internal/config"
	"github.com/salt-volumes/salt-volumes/internal/kube"
	"github.com/salt-volumes/salt-volumes/internal/requests"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
)

// restConfig is how to reach the API server of the kubernetes: section.
func restConfig(k *config.Kubernetes) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if k.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w (set kubernetes.kubeconfig outside a pod)", err)
	}
	rc.UserAgent = "salt-volumes"
	return rc, nil
}

// newKube connects the Kubernetes controller (PVs, claims); leading, when
// set, gates what only the leader does.
func newKube(k *config.Kubernetes, salt *saltapi.Client, leading func() bool, log *slog.Logger) (*kube.Controller, error) {
	rc, err := restConfig(k)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	nodes := &kube.NodeMap{Grain: k.NodeNameGrain, Fetch: func(ctx context.Context, grain string) (map[string]json.RawMessage, error) {
		ret, err := salt.Run(ctx, saltapi.Lowstate{"client": "local", "tgt": "*", "fun": "grains.get", "arg": []any{grain}})
		if err != nil {
			return nil, err
		}
		out := map[string]json.RawMessage{}
		if len(ret) > 0 {
			if err := json.Unmarshal(ret[0], &out); err != nil {
				return nil, fmt.Errorf("unexpected answer to grains.get: %w", err)
			}
		}
		return out, nil
	}}
	return kube.New(cs, kube.Config{StorageClass: k.StorageClass, Provisioner: k.Provisioner, Nodes: nodes, Leading: leading}, log), nil
}

// kubeVolumes is what the Kubernetes controller asks of the control plane:
// requests (a claim's volume, a claim's growth) and a fresh pass over a
// volume whose PersistentVolume or claim changed.
type kubeVolumes struct {
	*requests.Service
	touch func(name string)
}

func (k kubeVolumes) Touch(name string) { k.touch(name) }
