// Package bundlecache keeps the controller's last good bundle from a bundle server in a
// ConfigMap (an engine.BundleStore), so that it outlives the controller's pods: a rollout of a
// newer kit, or a pod rescheduled while the bundle server is down, starts from it. The kit
// ships the ConfigMap empty (kubectl apply and helm upgrade then keep what the controller
// wrote) and lets the controller get and update only that one.
//
// Every replica polls the server and may write: all write the server's bundle, the last write
// wins. What is read back is verified and validated again by the engine, as any bundle.
package bundlecache

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/virt-rules/virt-rules/engine"
)

// Keys of the ConfigMap: the bundle as served (signature included) and its ETag.
const (
	BundleKey = engine.CachedBundleFile
	ETagKey   = "bundle.etag"
)

// MaxBytes is the largest bundle kept: a ConfigMap holds at most 1 MiB of data, and the ETag
// and the object's metadata need some of it. A larger bundle serves, but is not persisted
// (a BundleRefused Event with reason persist says so).
const MaxBytes = 1<<20 - 16<<10

// ErrTooLarge is a bundle over MaxBytes.
var ErrTooLarge = errors.New("bundle too large for a ConfigMap")

// ConfigMap is an engine.BundleStore in the ConfigMap Key names, read and written through c
// (a client that reads from the API server, not from a cache).
type ConfigMap struct {
	c   client.Client
	key client.ObjectKey
}

// New is the store in ConfigMap key.
func New(c client.Client, key client.ObjectKey) *ConfigMap {
	return &ConfigMap{c: c, key: key}
}

func (s *ConfigMap) String() string { return "configmap " + s.key.String() }

// Load implements engine.BundleStore.
func (s *ConfigMap) Load(ctx context.Context) ([]byte, string, error) {
	cm := &corev1.ConfigMap{}
	if err := s.c.Get(ctx, s.key, cm); err != nil {
		return nil, "", fmt.Errorf("get configmap %s: %w", s.key, err)
	}
	return cm.BinaryData[BundleKey], cm.Data[ETagKey], nil
}

// Save implements engine.BundleStore.
func (s *ConfigMap) Save(ctx context.Context, raw []byte, etag string) error {
	if len(raw)+len(etag) > MaxBytes {
		return fmt.Errorf("configmap %s: %w: %d bytes, over %d", s.key, ErrTooLarge, len(raw), MaxBytes)
	}
	return s.update(ctx, func(cm *corev1.ConfigMap) {
		if cm.BinaryData == nil {
			cm.BinaryData = map[string][]byte{}
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.BinaryData[BundleKey] = raw
		cm.Data[ETagKey] = etag
	})
}

// Clear implements engine.BundleStore.
func (s *ConfigMap) Clear(ctx context.Context) error {
	return s.update(ctx, func(cm *corev1.ConfigMap) {
		delete(cm.BinaryData, BundleKey)
		delete(cm.Data, ETagKey)
	})
}

// update changes the ConfigMap with change, again on a conflict with another replica.
func (s *ConfigMap) update(ctx context.Context, change func(*corev1.ConfigMap)) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm := &corev1.ConfigMap{}
		if err := s.c.Get(ctx, s.key, cm); err != nil {
			return err
		}
		change(cm)
		return s.c.Update(ctx, cm, client.FieldOwner(FieldOwner))
	})
	if err != nil {
		return fmt.Errorf("update configmap %s: %w", s.key, err)
	}
	return nil
}

// FieldOwner is the field manager of the ConfigMap's data.
const FieldOwner = "virt-rules-bundle-cache"

var _ engine.BundleStore = (*ConfigMap)(nil)
