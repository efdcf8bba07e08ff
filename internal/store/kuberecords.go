package store

import (
	"context"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KubeRecords keeps records as Secrets in the control plane's namespace
// when its volumes are Volume objects: the records hold token hashes and
// who did what, which RBAC should guard as it guards secrets, not publish
// as it may publish Volume objects.
type KubeRecords struct {
	Client    kubernetes.Interface
	Namespace string
	// Timeout bounds one request (default 10s).
	Timeout time.Duration
}

const (
	recordKindLabel = "salt-volumes.io/record"
	recordKeyAnno   = "salt-volumes.io/key"
	recordSecret    = corev1.SecretType("salt-volumes.io/record")
)

func (k *KubeRecords) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	t := k.Timeout
	if t <= 0 {
		t = 10 * time.Second
	}
	return context.WithTimeout(ctx, t)
}

func recordObject(kind, key string) string { return "salt-volumes-" + kind + "-" + key }

// PutRecord creates the record's Secret, or replaces its data.
func (k *KubeRecords) PutRecord(ctx context.Context, kind, key string, data []byte) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	ctx, cancel := k.ctx(ctx)
	defer cancel()
	api := k.Client.CoreV1().Secrets(k.Namespace)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: recordObject(kind, key),
			Labels:      map[string]string{recordKindLabel: kind, "app.kubernetes.io/managed-by": "salt-volumes"},
			Annotations: map[string]string{recordKeyAnno: key}},
		Type: recordSecret,
		Data: map[string][]byte{"record": data},
	}
	_, err := api.Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var cur *corev1.Secret
		if cur, err = api.Get(ctx, sec.Name, metav1.GetOptions{}); err == nil {
			cur.Data = sec.Data
			_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return kubeUnavailable("writing a "+kind+" record", err)
	}
	return nil
}

// GetRecord reads one record's Secret from the API server.
func (k *KubeRecords) GetRecord(ctx context.Context, kind, key string) ([]byte, error) {
	if err := checkRecord(kind, key); err != nil {
		return nil, err
	}
	ctx, cancel := k.ctx(ctx)
	defer cancel()
	sec, err := k.Client.CoreV1().Secrets(k.Namespace).Get(ctx, recordObject(kind, key), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, ErrNoRecord
	}
	if err != nil {
		return nil, kubeUnavailable("reading a "+kind+" record", err)
	}
	return sec.Data["record"], nil
}

// ListRecords lists a kind's Secrets by label, sorted by key.
func (k *KubeRecords) ListRecords(ctx context.Context, kind string) ([]Record, error) {
	if err := checkRecord(kind, ""); err != nil {
		return nil, err
	}
	ctx, cancel := k.ctx(ctx)
	defer cancel()
	list, err := k.Client.CoreV1().Secrets(k.Namespace).List(ctx, metav1.ListOptions{LabelSelector: recordKindLabel + "=" + kind})
	if err != nil {
		return nil, kubeUnavailable("listing "+kind+" records", err)
	}
	out := make([]Record, 0, len(list.Items))
	for _, s := range list.Items {
		if s.Type != recordSecret {
			continue
		}
		out = append(out, Record{Key: s.Annotations[recordKeyAnno], Data: s.Data["record"]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// DeleteRecord deletes the record's Secret.
func (k *KubeRecords) DeleteRecord(ctx context.Context, kind, key string) error {
	if err := checkRecord(kind, key); err != nil {
		return err
	}
	ctx, cancel := k.ctx(ctx)
	defer cancel()
	err := k.Client.CoreV1().Secrets(k.Namespace).Delete(ctx, recordObject(kind, key), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return kubeUnavailable("deleting a "+kind+" record", err)
	}
	return nil
}
