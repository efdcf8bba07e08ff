package main

import (
	"context"

	"github.com/salt-volumes/salt-volumes/internal/kube"
)

// pv prints the local PersistentVolume for an Available volume, for
// kubectl apply -f -.
func (c *cli) pv(ctx context.Context, in []string) error {
	fs := c.flags("pv")
	// The class of operators' volumes, not the provisioning one: a PV
	// without a claimRef in a class tenants' claims use could be bound
	// by any of them.
	class := fs.String("storage-class", kube.DefaultStaticClass, "storageClassName of the PV")
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

// storageClass prints a StorageClass of salt-volumes; it needs no server.
func (c *cli) storageClass(_ context.Context, in []string) error {
	fs := c.flags("storageclass")
	var o kube.ClassOptions
	fs.StringVar(&o.Name, "name", "", "StorageClass name (default "+kube.DefaultStorageClass+", or "+kube.DefaultStaticClass+" with --static)")
	fs.BoolVar(&o.Static, "static", false, "no provisioner: PVs made with salt-volumes pv (without Kubernetes mode)")
	fs.StringVar(&o.Provisioner, "provisioner", kube.DefaultProvisioner, "provisioner name (serve's kubernetes.provisioner)")
	fs.StringVar(&o.ReclaimPolicy, "reclaim-policy", "Delete", "Delete (the claim's deletion deletes the volume) or Retain")
	fs.StringVar(&o.FSType, "fs-type", "", "fsType parameter: ext4 (default) or xfs")
	fs.StringVar(&o.MkfsOptions, "mkfs-options", "", "mkfsOptions parameter, space-separated (the spec's allow-list applies)")
	var mountOpts multi
	fs.Var(&mountOpts, "mount-option", "mount option for Filesystem volumes (repeat for each)")
	if _, err := args(fs, in, 0, "takes no arguments"); err != nil {
		return err
	}
	o.MountOptions = mountOpts
	if o.Name == "" {
		o.Name = kube.DefaultStorageClass
		if o.Static {
			o.Name = kube.DefaultStaticClass
		}
	}
	sc, err := kube.NewStorageClass(o)
	if err != nil {
		return failf(exitUsage, "%v", err)
	}
	return c.yaml(sc)
}

func (c *cli) yaml(obj any) error {
	b, err := kube.Marshal(obj)
	if err != nil {
		return failf(exitFailed, "rendering YAML: %v", err)
	}
	_, err = c.out.Write(b)
	return err
}
