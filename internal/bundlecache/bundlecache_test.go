package bundlecache_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/virt-rules/virt-rules/internal/bundlecache"
)

var key = client.ObjectKey{Namespace: "virt-rules", Name: "virt-rules-bundle-cache"}

func store(t *testing.T, objs ...client.Object) (*bundlecache.ConfigMap, client.Client) {
	t.Helper()
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	return bundlecache.New(c, key), c
}

func TestSaveLoadClear(t *testing.T) {
	ctx := context.Background()
	s, c := store(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{"app.kubernetes.io/name": "virt-rules"}}})
	raw, etag, err := s.Load(ctx)
	if err != nil || raw != nil || etag != "" {
		t.Fatalf("empty ConfigMap: Load = %q, %q, %v; want nothing", raw, etag, err)
	}
	bundle := []byte{0x1f, 0x8b, 0, 1, 2, 0xff}
	if err := s.Save(ctx, bundle, `"rev-1"`); err != nil {
		t.Fatal(err)
	}
	if raw, etag, err = s.Load(ctx); err != nil || !bytes.Equal(raw, bundle) || etag != `"rev-1"` {
		t.Fatalf("Load after Save = %v, %q, %v", raw, etag, err)
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, key, cm); err != nil {
		t.Fatal(err)
	}
	if cm.Labels["app.kubernetes.io/name"] != "virt-rules" {
		t.Errorf("Save dropped the kit's labels: %v", cm.Labels)
	}
	if err := s.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	if raw, etag, err = s.Load(ctx); err != nil || raw != nil || etag != "" {
		t.Fatalf("Load after Clear = %v, %q, %v; want nothing", raw, etag, err)
	}
}

func TestSaveRefusesWhatAConfigMapCannotHold(t *testing.T) {
	s, _ := store(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
	err := s.Save(context.Background(), make([]byte, bundlecache.MaxBytes+1), "e")
	if !errors.Is(err, bundlecache.ErrTooLarge) {
		t.Fatalf("Save of %d bytes: %v, want ErrTooLarge", bundlecache.MaxBytes+1, err)
	}
}

func TestMissingConfigMapIsAnError(t *testing.T) {
	s, _ := store(t)
	if _, _, err := s.Load(context.Background()); !apierrors.IsNotFound(err) {
		t.Errorf("Load: %v, want NotFound naming the ConfigMap", err)
	}
	if err := s.Save(context.Background(), []byte("x"), "e"); !apierrors.IsNotFound(err) {
		t.Errorf("Save: %v, want NotFound", err)
	}
}
