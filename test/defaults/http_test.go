//go:build libvirt

package defaults_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
)

func httptestRecorder(h http.Handler, method, path string) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Code
}

func httptestRecorderBody(h http.Handler, method, path string, body []byte) map[int]string {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, bytes.NewReader(body)))
	return map[int]string{rec.Code: rec.Body.String()}
}
