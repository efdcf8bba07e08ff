package main

import (
	"github.com/spf13/cobra"

	"github.com/salt-volumes/salt-volumes/internal/kube"
)

// pvCmd prints the local PersistentVolume for an Available volume, for
// kubectl apply -f -.
func (c *cli) pvCmd() *cobra.Command {
	var o kube.Options
	cmd := &cobra.Command{
		Use:   "pv NAME",
		Short: "A local PersistentVolume for a volume (YAML, for kubectl)",
		Long: `Print a local PersistentVolume for an Available volume, pinned to its node,
for kubectl apply -f - (without Kubernetes mode, where serve makes them).
YAML by default, or -o json. It has no claimRef: by default it goes in the
class of operators' volumes (salt-volumes-static), which no tenant's claim
of the provisioning class binds.`,
		Example: `  salt-volumes pv data-1 | kubectl apply -f -
  salt-volumes pv data-1 --storage-class fast --mount-option noatime`,
		Args:              exactArgs(1, "give one volume NAME"),
		ValidArgsFunction: c.completeArgs(listVolumes),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := argName(cmd, args[0], "volume")
			if err != nil {
				return err
			}
			cl, err := c.client()
			if err != nil {
				return err
			}
			v, err := cl.Get(cmd.Context(), name)
			if err != nil {
				return err
			}
			obj, err := kube.NewPersistentVolume(v, o)
			if err != nil {
				return failf(exitRefused, "%v", err)
			}
			return c.manifest(obj)
		},
	}
	f := cmd.Flags()
	// The class of operators' volumes, not the provisioning one: a PV
	// without a claimRef in a class tenants' claims use could be bound
	// by any of them.
	f.StringVar(&o.StorageClass, "storage-class", kube.DefaultStaticClass, "storageClassName of the PV")
	f.StringVar(&o.Hostname, "hostname", "", "the node's kubernetes.io/hostname label (default: the Salt minion id)")
	f.StringVar(&o.ReclaimPolicy, "reclaim-policy", "Retain", "Retain or Delete")
	f.StringArrayVar(&o.MountOptions, "mount-option", nil, "a mount option for a Filesystem volume (repeat for each)")
	_ = cmd.RegisterFlagCompletionFunc("reclaim-policy", fixed("Retain", "Delete"))
	for _, free := range []string{"storage-class", "hostname", "mount-option"} {
		_ = cmd.RegisterFlagCompletionFunc(free, cobra.NoFileCompletions)
	}
	return objects(cmd, fmtTable, fmtJSON, fmtYAML)
}

// storageClassCmd prints a StorageClass of salt-volumes; it needs no
// server.
func (c *cli) storageClassCmd() *cobra.Command {
	var o kube.ClassOptions
	cmd := &cobra.Command{
		Use:   "storageclass",
		Short: "A StorageClass of salt-volumes (YAML, for kubectl)",
		Long: `Print a StorageClass of salt-volumes for kubectl apply -f -: the
provisioning class (claims of it are provisioned on the node the scheduler
picks), or with --static the class of PVs made with salt-volumes pv. YAML
by default, or -o json. It asks no server.`,
		Example: `  salt-volumes storageclass | kubectl apply -f -
  salt-volumes storageclass --name fast-xfs --fs-type xfs --reclaim-policy Retain`,
		Args: noArgs("takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Name == "" {
				o.Name = kube.DefaultStorageClass
				if o.Static {
					o.Name = kube.DefaultStaticClass
				}
			}
			sc, err := kube.NewStorageClass(o)
			if err != nil {
				return usagef(cmd, "%v", err)
			}
			return c.manifest(sc)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Name, "name", "", "StorageClass name (default "+kube.DefaultStorageClass+", or "+kube.DefaultStaticClass+" with --static)")
	f.BoolVar(&o.Static, "static", false, "no provisioner: PVs made with salt-volumes pv (without Kubernetes mode)")
	f.StringVar(&o.Provisioner, "provisioner", kube.DefaultProvisioner, "provisioner name (serve's kubernetes.provisioner)")
	f.StringVar(&o.ReclaimPolicy, "reclaim-policy", "Delete", "Delete (the claim's deletion deletes the volume) or Retain")
	f.StringVar(&o.FSType, "fs-type", "", "fsType parameter: ext4 (default) or xfs")
	f.StringVar(&o.MkfsOptions, "mkfs-options", "", "mkfsOptions parameter, space-separated (the spec's allow-list applies)")
	f.StringArrayVar(&o.MountOptions, "mount-option", nil, "a mount option for Filesystem volumes (repeat for each)")
	_ = cmd.RegisterFlagCompletionFunc("reclaim-policy", fixed("Delete", "Retain"))
	_ = cmd.RegisterFlagCompletionFunc("fs-type", fixed("ext4", "xfs"))
	for _, free := range []string{"name", "provisioner", "mkfs-options", "mount-option"} {
		_ = cmd.RegisterFlagCompletionFunc(free, cobra.NoFileCompletions)
	}
	return objects(cmd, fmtTable, fmtJSON, fmtYAML)
}

// manifest prints a Kubernetes object: YAML as kubectl writes it, or
// JSON.
func (c *cli) manifest(obj any) error {
	if c.format() == fmtJSON {
		return c.json(obj)
	}
	b, err := kube.Marshal(obj)
	if err != nil {
		return failf(exitFailed, "rendering YAML: %v", err)
	}
	_, err = c.out.Write(b)
	return err
}
