package metrics

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"strconv"
	"strings"
)

// contentType is the text exposition format Prometheus 2.x reads.
const contentType = "text/plain; version=0.0.4; charset=utf-8"

// Handler serves the latest collection. It writes bytes rendered by the
// last collection plus the collection's age; it calls nothing else.
func (c *Collector) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		out := c.out.Load()
		if out.at.IsZero() {
			http.Error(w, "no collection yet", http.StatusServiceUnavailable)
			return
		}
		age := c.cfg.Now().Sub(out.at).Seconds()
		tail := "# HELP " + ageFamily + " Time since the collection this scrape serves.\n# TYPE " + ageFamily + " gauge\n" +
			ageFamily + " " + strconv.FormatFloat(age, 'g', -1, 64) + "\n"
		w.Header().Set("Content-Type", contentType)
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			out.gzOnce.Do(func() { out.gz = c.gzip(out.text) })
			// A gzip stream may be followed by another member: the age
			// goes in a second one, so the cached first stays as it is.
			// Compressors are pooled: each holds buffers of hundreds of KiB.
			tz := c.gzip([]byte(tail))
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Length", strconv.Itoa(len(out.gz)+len(tz)))
			if r.Method == http.MethodGet {
				w.Write(out.gz)
				w.Write(tz)
			}
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(out.text)+len(tail)))
		if r.Method == http.MethodGet {
			w.Write(out.text)
			w.Write([]byte(tail))
		}
	})
}

// gzip compresses b with a pooled compressor (each holds buffers of
// hundreds of KiB, too much to allocate per scrape).
func (c *Collector) gzip(b []byte) []byte {
	var buf bytes.Buffer
	zw, _ := c.gzips.Get().(*gzip.Writer)
	if zw == nil {
		zw, _ = gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	} else {
		zw.Reset(&buf)
	}
	zw.Write(b)
	zw.Close()
	c.gzips.Put(zw)
	return buf.Bytes()
}
