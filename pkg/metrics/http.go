package metrics

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	// zstd is offered beside gzip when a scraper asks for it.
	_ "github.com/prometheus/client_golang/prometheus/promhttp/zstd"
	dto "github.com/prometheus/client_model/go"
)

// errNoCollection is Gather's answer before the first collection.
var errNoCollection = errors.New("no collection yet")

var _ prometheus.Gatherer = (*Collector)(nil)

// Gather returns the latest collection's families (built by the first
// Gather after the collection, from what it read), and the collection's
// age, the one value computed at each call. It calls nothing else: no
// NVML, no store, no share loop. The families returned are shared with
// other scrapes and must not be changed.
func (c *Collector) Gather() ([]*dto.MetricFamily, error) {
	out := c.current()
	if out.at.IsZero() {
		return nil, errNoCollection
	}
	age := c.cfg.Now().Sub(out.at).Seconds()
	mfs := make([]*dto.MetricFamily, len(out.mfs), len(out.mfs)+1)
	copy(mfs, out.mfs)
	return append(mfs, &dto.MetricFamily{Name: &ageName, Help: &ageHelp, Type: dto.MetricType_GAUGE.Enum(),
		Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: &age}}}}), nil
}

var ageName, ageHelp = ageFamily, "Time since the collection this scrape serves."

// Handler serves the latest collection through promhttp, which
// negotiates the format (text, OpenMetrics, protobuf) and the encoding
// (gzip, zstd) with the scraper. Before the first collection it answers
// 503.
func (c *Collector) Handler() http.Handler {
	h := promhttp.HandlerFor(c, promhttp.HandlerOpts{
		ErrorLog:          slogLogger{c},
		ErrorHandling:     promhttp.HTTPErrorOnError,
		EnableOpenMetrics: true,
	})
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
		h.ServeHTTP(w, r)
	})
}

// slogLogger is promhttp's error log on the collector's logger.
type slogLogger struct{ c *Collector }

func (l slogLogger) Println(v ...any) { l.c.log.Error("metrics endpoint", "err", v) }
