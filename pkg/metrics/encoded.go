package metrics

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// encoding is one collection's families in one exposition format,
// encoded once for every scrape of the collection that asks for that
// format: the bytes, and their gzip stream so far (header and deflate
// blocks ending in a sync flush, with no final block), so that a scrape
// writes what promhttp would write for the collection and its age while
// encoding and compressing only the age.
type encoding struct {
	once sync.Once
	body []byte
	gz   []byte
	crc  uint32
}

// encodings holds a collection's encodings by format (the negotiated
// Content-Type, escaping scheme included).
type encodings struct {
	mu sync.Mutex
	m  map[expfmt.Format]*encoding
}

func (e *encodings) get(f expfmt.Format) *encoding {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[expfmt.Format]*encoding{}
	}
	enc := e.m[f]
	if enc == nil {
		enc = &encoding{}
		e.m[f] = enc
	}
	return enc
}

// encode fills enc with mfs in format f, once a collection per format
// asked for. It compresses without state kept between calls
// (klauspost's StatelessCompression: blocks of 32 KiB, each matched
// against the 8 KiB before it): a compress/gzip writer, even at
// BestSpeed, is 1.1 MiB of hash tables, which a pool keeps live (the
// daemon's largest object, doubled by the GC's heap goal) and loses at
// every other GC, so a daemon scraped often allocated one a collection.
// The stream is some 10% larger; it is made once a collection.
func (enc *encoding) encode(c *Collector, f expfmt.Format, mfs []*dto.MetricFamily) {
	enc.once.Do(func() {
		var buf bytes.Buffer
		buf.Grow(int(c.encSize.Load())) // the last collection's size: no regrowth
		e := expfmt.NewEncoder(&buf, f)
		for _, mf := range mfs {
			if err := e.Encode(mf); err != nil {
				c.log.Error("metrics encoding is incomplete", "family", mf.GetName(), "format", string(f), "err", err)
			}
		}
		enc.body = buf.Bytes()
		if n := int64(len(enc.body) + len(enc.body)/16); n > c.encSize.Load() {
			c.encSize.Store(n)
		}
		enc.crc = crc32.ChecksumIEEE(enc.body)
		var gz bytes.Buffer
		gz.Grow(len(enc.body) / 8)
		zw, _ := gzip.NewWriterLevel(&gz, gzip.StatelessCompression)
		// One Write: its blocks end with an empty stored block, not final,
		// as a sync flush ends them (byte-aligned, the stream open). The
		// writer is not closed: gzipEnd writes the final block.
		zw.Write(enc.body)
		enc.gz = gz.Bytes()
	})
}

// tail encodes the per-scrape families (the age first) in format f, and
// for OpenMetrics the closing "# EOF", as promhttp's encoder ends a scrape.
func tail(f expfmt.Format, fams []*dto.MetricFamily) ([]byte, error) {
	var buf bytes.Buffer
	e := expfmt.NewEncoder(&buf, f)
	for _, mf := range fams {
		if err := e.Encode(mf); err != nil {
			return nil, err
		}
	}
	if cl, ok := e.(expfmt.Closer); ok {
		if err := cl.Close(); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// gzipEnd is what finishes enc's gzip stream after enc.gz: t in stored
// deflate blocks (RFC 1951 3.2.4; at most 65535 bytes each, the last one
// final) and the trailer over the body and t (RFC 1952), so the response
// is one gzip member however the client reads it. enc.gz itself is
// written as it is, not copied.
func (enc *encoding) gzipEnd(t []byte) []byte {
	const maxStored = 0xffff // a stored block's LEN is 16 bits
	out := make([]byte, 0, 5*(len(t)/maxStored+1)+len(t)+8)
	rest := t
	for {
		n := min(len(rest), maxStored)
		final := byte(0)
		if n == len(rest) {
			final = 1
		}
		// BFINAL, BTYPE=00 (stored), then LEN and NLEN, little-endian.
		out = append(out, final, byte(n), byte(n>>8), ^byte(n), ^byte(n>>8))
		out = append(out, rest[:n]...)
		rest = rest[n:]
		if final == 1 {
			break
		}
	}
	out = binary.LittleEndian.AppendUint32(out, crc32.Update(enc.crc, crc32.IEEETable, t))
	return binary.LittleEndian.AppendUint32(out, uint32(len(enc.body)+len(t)))
}

// contentCoding is the encoding a request's Accept-Encoding prefers among
// those vgpud serves (RFC 9110 12.5.3: the highest q wins; at equal q,
// gzip, which the cache serves, before zstd; identity when none is
// acceptable).
func contentCoding(header string) string {
	q := map[string]float64{}
	for _, part := range strings.Split(header, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		name = strings.ToLower(strings.TrimSpace(name))
		v := 1.0
		if k, val, ok := strings.Cut(strings.TrimSpace(params), "="); ok && strings.TrimSpace(k) == "q" {
			if p, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
				v = p
			}
		}
		if name != "" {
			q[name] = v
		}
	}
	if star, ok := q["*"]; ok {
		for _, c := range []string{"gzip", "zstd"} {
			if _, named := q[c]; !named {
				q[c] = star
			}
		}
	}
	best, bq := "identity", 0.0
	for _, c := range []string{"gzip", "zstd"} {
		if q[c] > bq {
			best, bq = c, q[c]
		}
	}
	return best
}
