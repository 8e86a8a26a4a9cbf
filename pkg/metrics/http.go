package metrics

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/prometheus/client_golang/prometheus/promhttp/zstd" // promhttp offers zstd once imported
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// errNoCollection is Gather's answer before the first collection.
var errNoCollection = errors.New("no collection yet")

var _ prometheus.Gatherer = (*Collector)(nil)

// Gather returns the latest collection's families (built by the first
// Gather after the collection, from what it read), the collection's age,
// the one value computed at each call, and Config.Extra's families. It
// calls nothing else: no NVML, no store, no share loop. The families
// returned are shared with other scrapes and must not be changed.
func (c *Collector) Gather() ([]*dto.MetricFamily, error) {
	out := c.current()
	if out.at.IsZero() {
		return nil, errNoCollection
	}
	tail, err := c.perScrape(out)
	if err != nil {
		return nil, err
	}
	mfs := make([]*dto.MetricFamily, len(out.mfs), len(out.mfs)+len(tail))
	copy(mfs, out.mfs)
	return append(mfs, tail...), nil
}

// perScrape are the families made at each scrape, served after the
// collection's: its age, then Config.Extra's.
func (c *Collector) perScrape(out *built) ([]*dto.MetricFamily, error) {
	mfs := []*dto.MetricFamily{c.age(out)}
	if c.cfg.Extra == nil {
		return mfs, nil
	}
	extra, err := c.cfg.Extra.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering the extra families: %w", err)
	}
	return append(mfs, extra...), nil
}

// age is the collection age family as of now.
func (c *Collector) age(out *built) *dto.MetricFamily {
	age := c.cfg.Now().Sub(out.at).Seconds()
	return &dto.MetricFamily{Name: &ageName, Help: &ageHelp, Type: dto.MetricType_GAUGE.Enum(),
		Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: &age}}}}
}

var ageName, ageHelp = ageFamily, "Time since the collection this scrape serves."

// Handler serves the latest collection in the format the scraper asks
// for (text, OpenMetrics, protobuf: promhttp's negotiation), plain, gzip
// or zstd. Plain and gzip responses write the collection's encoding in
// that format, made by the first scrape that asked for it, and the age
// and Config.Extra's families encoded for this scrape, in one gzip member; they are, decompressed,
// byte for byte what promhttp writes for the Gatherer, which serves zstd itself.
// Encoding and compressing the collection at every scrape, as promhttp
// does, costs more than ten times the scrape latency goal on the
// benchmark host (docs/metrics.md, "Benchmark"). Before the first
// collection it answers 503.
func (c *Collector) Handler() http.Handler {
	prom := promhttp.HandlerFor(c, promhttp.HandlerOpts{
		ErrorLog:          slogLogger{c},
		ErrorHandling:     promhttp.HTTPErrorOnError,
		EnableOpenMetrics: true,
	})
	formats := expfmt.DefaultOpenMetricsAcceptedFormats()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if c.latest.Load() == nil {
			http.Error(w, errNoCollection.Error(), http.StatusServiceUnavailable)
			return
		}
		coding := contentCoding(r.Header.Get("Accept-Encoding"))
		if coding == "zstd" {
			prom.ServeHTTP(w, r)
			return
		}
		out := c.current()
		if out.at.IsZero() {
			http.Error(w, errNoCollection.Error(), http.StatusServiceUnavailable)
			return
		}
		f := expfmt.NegotiateAccept(r.Header, formats...)
		enc := out.enc.get(f)
		enc.encode(c, f, out.mfs)
		fams, err := c.perScrape(out)
		if err != nil {
			c.log.Error("metrics endpoint", "err", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		t, err := tail(f, fams)
		if err != nil {
			c.log.Error("metrics endpoint", "err", err)
			http.Error(w, "encoding the collection age: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Add("Vary", "Accept")
		h.Add("Vary", "Accept-Encoding")
		h.Set("Content-Type", string(f))
		var parts [2][]byte
		if coding == "gzip" {
			h.Set("Content-Encoding", "gzip")
			parts[0], parts[1] = enc.gz, enc.gzipEnd(t)
		} else {
			parts[0], parts[1] = enc.body, t
		}
		h.Set("Content-Length", strconv.Itoa(len(parts[0])+len(parts[1])))
		if r.Method == http.MethodGet {
			w.Write(parts[0])
			w.Write(parts[1])
		}
	})
}

// slogLogger is promhttp's error log on the collector's logger.
type slogLogger struct{ c *Collector }

func (l slogLogger) Println(v ...any) { l.c.log.Error("metrics endpoint", "err", v) }
