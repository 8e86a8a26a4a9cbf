package metrics

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"hash/crc32"
	"net/http"
	"strconv"
	"strings"
)

// contentType is the text exposition format Prometheus 2.x reads.
const contentType = "text/plain; version=0.0.4; charset=utf-8"

// Handler serves the latest collection: the first scrape after a
// collection renders it (from what the collection read), the others write
// that rendering; each adds the collection's age. It calls nothing else.
func (c *Collector) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		out := c.current()
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
			tz := gzipStored([]byte(tail))
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
// hundreds of KiB, too much to allocate per rendering).
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

// gzipStored wraps b (under 64 KiB) in a gzip member without compressing
// it: one stored deflate block (RFC 1951 3.2.4) between the gzip header
// and trailer (RFC 1952). The age line is a hundred bytes: a pooled
// compressor per scrape costs more than it saves, and the pool empties
// at every other GC, when a new one (hundreds of KiB) is allocated.
func gzipStored(b []byte) []byte {
	n := len(b)
	out := make([]byte, 0, 10+5+n+8)
	// ID1 ID2, CM deflate, no flags, no mtime, XFL 0, OS unknown.
	out = append(out, 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255)
	// BFINAL=1, BTYPE=00 (stored), then LEN and NLEN, little-endian.
	out = append(out, 1, byte(n), byte(n>>8), ^byte(n), ^byte(n>>8))
	out = append(out, b...)
	out = binary.LittleEndian.AppendUint32(out, crc32.ChecksumIEEE(b))
	return binary.LittleEndian.AppendUint32(out, uint32(n))
}
