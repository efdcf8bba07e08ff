package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

// storeCmd holds the store's maintenance commands (serve stopped).
func (c *cli) storeCmd() *cobra.Command {
	return group(&cobra.Command{
		Use:     "store",
		Short:   "The store's maintenance, serve stopped: migrate",
		Long:    "Maintenance of the control plane's store, with every serve replica stopped. migrate moves every volume, token and audit record between stores.",
		Example: `  salt-volumes store migrate --from bbolt:/var/lib/salt-volumes-control/volumes.db --to etcd:https://10.0.0.1:2379`,
	}, c.storeMigrateCmd())
}

// storeMigrateCmd copies every volume, token and audit record from one
// store to another, empty one, and verifies the copy.
func (c *cli) storeMigrateCmd() *cobra.Command {
	var from, to, ns string
	var ec store.EtcdConfig
	cmd := &cobra.Command{
		Use:   "migrate --from SRC --to DST",
		Short: "Move every volume, token and audit record between stores",
		Long: `Copy every volume, then every token and audit record, from the store SRC
to the empty store DST, and verify the copy record by record. SRC and DST
are bbolt:FILE, etcd:URL[,URL...] or kubernetes:KUBECONFIG (Volume objects;
an empty KUBECONFIG: the pod's service account). An etcd store or cluster
where a serve replica still runs (an election under the prefix, a Lease
held) is refused: stop every replica first. A target that holds volumes is
refused (exit 1) and left alone.`,
		Example: `  salt-volumes store migrate --from bbolt:/var/lib/salt-volumes-control/volumes.db --to etcd:https://10.0.0.1:2379 \
      --etcd-ca-file ca.pem --etcd-cert-file client.pem --etcd-key-file client-key.pem
  salt-volumes store migrate --from etcd:https://10.0.0.1:2379 --to bbolt:/var/lib/salt-volumes-control/volumes.db`,
		Args: noArgs("takes no arguments (--from SRC --to DST)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" || to == "" {
				return usagef(cmd, "--from and --to are both needed, e.g. --from bbolt:/var/lib/salt-volumes-control/volumes.db --to etcd:https://10.0.0.1:2379")
			}
			return c.migrate(cmd.Context(), from, to, ec, ns)
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "source: bbolt:FILE, etcd:URL[,URL...] or kubernetes:KUBECONFIG")
	f.StringVar(&to, "to", "", "target (empty): bbolt:FILE, etcd:URL[,URL...] or kubernetes:KUBECONFIG")
	f.StringVar(&ec.Prefix, "etcd-prefix", "/salt-volumes", "etcd key prefix (serve's etcd.prefix)")
	f.StringVar(&ec.CAFile, "etcd-ca-file", "", "CA of the etcd members' certificates")
	f.StringVar(&ec.CertFile, "etcd-cert-file", "", "client certificate for etcd")
	f.StringVar(&ec.KeyFile, "etcd-key-file", "", "its key")
	f.StringVar(&ns, "namespace", "salt-volumes", "namespace of the election's Lease (serve's kubernetes.namespace), for kubernetes:")
	_ = cmd.RegisterFlagCompletionFunc("from", fixed("bbolt:", "etcd:", "kubernetes:"))
	_ = cmd.RegisterFlagCompletionFunc("to", fixed("bbolt:", "etcd:", "kubernetes:"))
	for _, file := range []string{"etcd-ca-file", "etcd-cert-file", "etcd-key-file"} {
		_ = cmd.MarkFlagFilename(file)
	}
	return cmd
}

func (c *cli) migrate(ctx context.Context, from, to string, ec store.EtcdConfig, ns string) error {
	src, srcRecords, closeSrc, err := openForMigration(ctx, "--from", from, ec, ns)
	if err != nil {
		return err
	}
	defer closeSrc()
	dst, dstRecords, closeDst, err := openForMigration(ctx, "--to", to, ec, ns)
	if err != nil {
		return err
	}
	defer closeDst()
	n, err := store.Migrate(ctx, src, dst)
	if err != nil {
		return failf(exitFailed, "store migrate: %v", err)
	}
	fmt.Fprintf(c.out, "migrated %d volumes from %s to %s; verified: %d records in each, every record the same\n", n, from, to, n)
	// Tokens and the audit trail go with them: the same service tokens
	// and sessions keep working, and the history stays.
	m, err := store.MigrateRecords(ctx, srcRecords, dstRecords, store.RecordKinds)
	if err != nil {
		return failf(exitFailed, "store migrate: the volumes are migrated, the tokens and audit trail not all: %v (running it again into a new target is safe)", err)
	}
	fmt.Fprintf(c.out, "migrated %d token and audit records\n", m)
	return nil
}

// openForMigration opens one side, refusing a store with records it
// cannot read (they would not be copied).
func openForMigration(ctx context.Context, flagName, where string, ec store.EtcdConfig, ns string) (store.Store, store.Records, func(), error) {
	st, rec, closeSt, skipped, err := openSide(ctx, flagName, where, ec, ns)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(skipped) > 0 {
		closeSt()
		return nil, nil, nil, failf(exitFailed, "%s: %d records cannot be read (%s): fix or remove them first", flagName, len(skipped), strings.Join(skipped, "; "))
	}
	return st, rec, closeSt, nil
}

// openSide opens bbolt:FILE or etcd:URLS. An etcd store that a serve
// replica still reconciles is refused: its writes would race the copy.
func openSide(ctx context.Context, flagName, where string, ec store.EtcdConfig, ns string) (store.Store, store.Records, func(), []string, error) {
	kind, arg, _ := strings.Cut(where, ":")
	switch kind {
	case "bbolt":
		st, err := store.Open(arg)
		if err != nil {
			return nil, nil, nil, nil, failf(exitFailed, "%s: %v", flagName, err)
		}
		return st, st, func() { st.Close() }, st.Skipped, nil
	case "etcd":
		ec.Endpoints = strings.Split(arg, ",")
		st, cli, err := store.OpenEtcd(ctx, ec)
		if err != nil {
			return nil, nil, nil, nil, failf(exitFailed, "%s: %v", flagName, err)
		}
		closeBoth := func() { st.Close(); cli.Close() }
		leaders, err := cli.Get(ctx, st.Prefix()+"/leader/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		switch {
		case err != nil:
			closeBoth()
			return nil, nil, nil, nil, failf(exitFailed, "%s: %v", flagName, err)
		case leaders.Count > 0:
			closeBoth()
			return nil, nil, nil, nil, failf(exitRefused, "%s: serve replicas are running on %s (an election under %s/leader): stop every replica first", flagName, where, st.Prefix())
		}
		return st, st, closeBoth, st.Skipped, nil
	case "kubernetes":
		st, cs, err := openKubeSide(ctx, arg, ns)
		if err != nil {
			return nil, nil, nil, nil, failf(exitFailed, "%s: %v", flagName, err)
		}
		if st == nil {
			return nil, nil, nil, nil, failf(exitRefused, "%s: a serve replica holds the Lease %s/salt-volumes: stop every replica first", flagName, ns)
		}
		// Beside Volume objects, records are Secrets in serve's namespace.
		return st, &store.KubeRecords{Client: cs, Namespace: ns}, func() { st.Close() }, st.Skipped, nil
	}
	return nil, nil, nil, nil, failf(exitUsage, "%s %q: write bbolt:FILE, etcd:URL[,URL...] or kubernetes:KUBECONFIG", flagName, where)
}

// openKubeSide opens the Volume objects of the cluster a kubeconfig names
// (empty: the pod's service account). It returns nil while a replica
// holds the election's Lease.
func openKubeSide(ctx context.Context, kubeconfig, ns string) (*store.Kube, kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	l, err := cs.CoordinationV1().Leases(ns).Get(ctx, "salt-volumes", metav1.GetOptions{})
	switch {
	case err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
		time.Since(l.Spec.RenewTime.Time) < time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second:
		return nil, nil, nil
	case err != nil && !apierrors.IsNotFound(err):
		return nil, nil, fmt.Errorf("reading the election's Lease: %w", err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	st, err := store.OpenKube(ctx, store.KubeConfig{Client: dc})
	return st, cs, err
}
