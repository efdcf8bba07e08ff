package main

import (
	"context"

	"github.com/salt-volumes/salt-volumes/internal/kube"
)

// pv prints the local PersistentVolume for an Available volume, for
// kubectl apply -f -.
func (c *cli) pv(ctx context.Context, in []string) error {
	fs := c.flags("pv")
	class := fs.String("storage-class", kube.DefaultStorageClass, "storageClassName of the PV")
	hostname := fs.String("hostname", "", "the node's kubernetes.io/hostname label (default: the Salt minion id)")
	reclaim := fs.String("reclaim-policy", "Retain", "Retain or Delete")
	var mountOpts multi
	fs.Var(&mountOpts, "mount-option", "mount option for a Filesystem volume (repeat for each)")
	pos, cl, err := c.open(fs, in, 1, "give one volume NAME")
	if err != nil {
		return err
	}
	v, err := cl.Get(ctx, pos[0])
	if err != nil {
		return err
	}
	obj, err := kube.NewPersistentVolume(v, kube.Options{
		StorageClass: *class, Hostname: *hostname, ReclaimPolicy: *reclaim, MountOptions: mountOpts,
	})
	if err != nil {
		return failf(exitRefused, "%v", err)
	}
	return c.yaml(obj)
}

// storageClass prints the StorageClass salt-volumes PVs belong to; it needs
// no server.
func (c *cli) storageClass(_ context.Context, in []string) error {
	fs := c.flags("storageclass")
	name := fs.String("name", kube.DefaultStorageClass, "StorageClass name")
	var mountOpts multi
	fs.Var(&mountOpts, "mount-option", "mount option for Filesystem volumes (repeat for each)")
	if _, err := args(fs, in, 0, "takes no arguments"); err != nil {
		return err
	}
	return c.yaml(kube.NewStorageClass(*name, mountOpts))
}

func (c *cli) yaml(obj any) error {
	b, err := kube.Marshal(obj)
	if err != nil {
		return failf(exitFailed, "rendering YAML: %v", err)
	}
	_, err = c.out.Write(b)
	return err
}
