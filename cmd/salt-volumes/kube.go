package main

import (
	"context"

	"github.com/salt-volumes/salt-volumes/internal/kube"
)

// pv prints the local PersistentVolume for an Available volume, for
// kubectl apply -f -.
func (c *cli) pv(ctx context.Context, args []string) int {
	fs := c.flags("pv")
	class := fs.String("storage-class", kube.DefaultStorageClass, "storageClassName of the PV")
	hostname := fs.String("hostname", "", "the node's kubernetes.io/hostname label (default: the Salt minion id)")
	reclaim := fs.String("reclaim-policy", "Retain", "Retain or Delete")
	var mountOpts multi
	fs.Var(&mountOpts, "mount-option", "mount option for a Filesystem volume (repeat for each)")
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 {
		return c.fail(exitUsage, "pv: give one volume NAME")
	}
	cl, err := c.client()
	if err != nil {
		return c.fail(exitUsage, "%v", err)
	}
	v, err := cl.Get(ctx, pos[0])
	if err != nil {
		return c.apiErr(err)
	}
	obj, err := kube.NewPersistentVolume(v, kube.Options{
		StorageClass: *class, Hostname: *hostname, ReclaimPolicy: *reclaim, MountOptions: mountOpts,
	})
	if err != nil {
		return c.fail(exitRefused, "%v", err)
	}
	return c.yaml(obj)
}

// storageClass prints the StorageClass salt-volumes PVs belong to; it needs
// no server.
func (c *cli) storageClass(args []string) int {
	fs := c.flags("storageclass")
	name := fs.String("name", kube.DefaultStorageClass, "StorageClass name")
	var mountOpts multi
	fs.Var(&mountOpts, "mount-option", "mount option for Filesystem volumes (repeat for each)")
	pos, err := parse(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 0 {
		return c.fail(exitUsage, "storageclass takes no arguments")
	}
	return c.yaml(kube.NewStorageClass(*name, mountOpts))
}

func (c *cli) yaml(obj any) int {
	b, err := kube.Marshal(obj)
	if err != nil {
		return c.fail(exitFailed, "rendering YAML: %v", err)
	}
	_, _ = c.out.Write(b)
	return exitOK
}
