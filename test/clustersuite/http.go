package clustersuite

import (
	"io"
	"net/http"
)

// HTTPDo sends req with c: the response's status code and body, or 0 and the error when there
// was no response.
func HTTPDo(c *http.Client, req *http.Request) (int, string) {
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// HTTPGet is HTTPDo of a GET of url.
func HTTPGet(c *http.Client, url string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	return HTTPDo(c, req)
}

// HTTPStatus is, for Eventually, the status code of a GET of url with c (0 without a
// response).
func HTTPStatus(c *http.Client, url string) func() int {
	return func() int {
		code, _ := HTTPGet(c, url)
		return code
	}
}
