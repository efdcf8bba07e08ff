package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/salt-volumes/salt-volumes/internal/store"
)

// storeCmd runs the store's maintenance commands (serve stopped).
func (c *cli) storeCmd(ctx context.Context, in []string) error {
	if len(in) == 0 || in[0] != "migrate" {
		return failf(exitUsage, "store: the command is: store migrate --from SRC --to DST (SRC, DST: bbolt:FILE or etcd:URL[,URL...])")
	}
	fs := flag.NewFlagSet("store migrate", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	from := fs.String("from", "", "source: bbolt:FILE or etcd:URL[,URL...]")
	to := fs.String("to", "", "target (empty): bbolt:FILE or etcd:URL[,URL...]")
	var ec store.EtcdConfig
	fs.StringVar(&ec.Prefix, "etcd-prefix", "/salt-volumes", "etcd key prefix (serve's etcd.prefix)")
	fs.StringVar(&ec.CAFile, "etcd-ca-file", "", "CA of the etcd members' certificates")
	fs.StringVar(&ec.CertFile, "etcd-cert-file", "", "client certificate for etcd")
	fs.StringVar(&ec.KeyFile, "etcd-key-file", "", "its key")
	if _, err := args(fs, in[1:], 0, "takes no arguments (--from SRC --to DST)"); err != nil {
		return err
	}
	if *from == "" || *to == "" {
		return failf(exitUsage, "store migrate: --from and --to are both needed, e.g. --from bbolt:/var/lib/salt-volumes-control/volumes.db --to etcd:https://10.0.0.1:2379")
	}
	src, closeSrc, err := openForMigration(ctx, "--from", *from, ec)
	if err != nil {
		return err
	}
	defer closeSrc()
	dst, closeDst, err := openForMigration(ctx, "--to", *to, ec)
	if err != nil {
		return err
	}
	defer closeDst()
	n, err := store.Migrate(src, dst)
	if err != nil {
		return failf(exitFailed, "store migrate: %v", err)
	}
	fmt.Fprintf(c.out, "migrated %d volumes from %s to %s; verified: %d records in each, every record the same\n", n, *from, *to, n)
	return nil
}

// openForMigration opens one side, refusing a store with records it
// cannot read (they would not be copied).
func openForMigration(ctx context.Context, flagName, where string, ec store.EtcdConfig) (store.Store, func(), error) {
	st, closeSt, skipped, err := openSide(ctx, flagName, where, ec)
	if err != nil {
		return nil, nil, err
	}
	if len(skipped) > 0 {
		closeSt()
		return nil, nil, failf(exitFailed, "%s: %d records cannot be read (%s): fix or remove them first", flagName, len(skipped), strings.Join(skipped, "; "))
	}
	return st, closeSt, nil
}

// openSide opens bbolt:FILE or etcd:URLS. An etcd store that a serve
// replica still reconciles is refused: its writes would race the copy.
func openSide(ctx context.Context, flagName, where string, ec store.EtcdConfig) (store.Store, func(), []string, error) {
	kind, arg, _ := strings.Cut(where, ":")
	switch kind {
	case "bbolt":
		st, err := store.Open(arg)
		if err != nil {
			return nil, nil, nil, failf(exitFailed, "%s: %v", flagName, err)
		}
		return st, func() { st.Close() }, st.Skipped, nil
	case "etcd":
		ec.Endpoints = strings.Split(arg, ",")
		st, cli, err := store.OpenEtcd(ctx, ec)
		if err != nil {
			return nil, nil, nil, failf(exitFailed, "%s: %v", flagName, err)
		}
		closeBoth := func() { st.Close(); cli.Close() }
		leaders, err := cli.Get(ctx, st.Prefix()+"/leader/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		switch {
		case err != nil:
			closeBoth()
			return nil, nil, nil, failf(exitFailed, "%s: %v", flagName, err)
		case leaders.Count > 0:
			closeBoth()
			return nil, nil, nil, failf(exitRefused, "%s: serve replicas are running on %s (an election under %s/leader): stop every replica first", flagName, where, st.Prefix())
		}
		return st, closeBoth, st.Skipped, nil
	}
	return nil, nil, nil, failf(exitUsage, "%s %q: write bbolt:FILE or etcd:URL[,URL...]", flagName, where)
}
