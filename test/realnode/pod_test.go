package realnode_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var _ = Describe("a plain pod of the controller image", func() {
	It("runs `virt-rules version` on the real node, its log read through the API server", func(sctx SpecContext) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "controller-version"},
			Spec: corev1.PodSpec{
				NodeName:      nodeName,
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name:            "controller",
					Image:           controllerImage,
					ImagePullPolicy: corev1.PullNever,
					Args:            []string{"version"},
				}},
			},
		}
		Expect(cluster.Client.Create(sctx, pod)).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			Expect(client.IgnoreNotFound(cluster.Client.Delete(ctx, pod))).To(Succeed())
		})
		began := time.Now()
		Eventually(func(g Gomega) corev1.PodPhase {
			g.Expect(cluster.Client.Get(sctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
			return pod.Status.Phase
		}).WithContext(sctx).Should(Equal(corev1.PodSucceeded), "the pod's status: %+v", &pod.Status)
		AddReportEntry("pod created -> Succeeded", time.Since(began).Round(time.Millisecond).String())
		Expect(pod.Status.ContainerStatuses).To(HaveLen(1))
		Expect(pod.Status.ContainerStatuses[0].ImageID).To(HavePrefix("sha256:"), "the image containerd ran")

		log, err := clientset.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(sctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(log)).To(MatchRegexp(`(?m)^virt-rules \S+$`), "the version line")
		Expect(string(log)).To(MatchRegexp(`(?m)^bundle \S+ \(embedded`), "the bundle line")
	}, SpecTimeout(3*time.Minute))
})
