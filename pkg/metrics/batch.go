package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/vgpud/vgpud/pkg/share"
)

// batch accumulates one collection's snapshot families as metric
// families (one per declared family, so a family's series stay together
// whatever order they come in).
type batch struct {
	c    *Collector
	gpus map[string]gpuIdent
	mets [][]*dto.Metric
	// pairs are the label pairs of the batch's series, shared: the
	// families are never changed once built.
	pairs map[[2]string]*dto.LabelPair
	err   error
}

func newBatch(c *Collector, gpus map[string]gpuIdent) *batch {
	return &batch{c: c, gpus: gpus, mets: make([][]*dto.Metric, len(c.fams)), pairs: map[[2]string]*dto.LabelPair{}}
}

func (b *batch) add(name string, v float64, labels ...string) {
	i, ok := b.c.famIdx[name]
	if !ok {
		b.err = errors.Join(b.err, fmt.Errorf("metric %s is not declared", name))
		return
	}
	f := &b.c.fams[i]
	if len(labels) != len(f.labels) {
		b.err = errors.Join(b.err, fmt.Errorf("metric %s: %d label values for %d labels", name, len(labels), len(f.labels)))
		return
	}
	// A series is one allocation with its value, and its label pointers
	// one more: the label pairs are shared by every series that has the
	// same label and value (a GPU's or an instance's labels are on tens
	// of families), which keeps a collection's families small.
	p := &point{v: v}
	if f.typ == counterType {
		p.c.Value = &p.v
		p.m.Counter = &p.c
	} else {
		p.g.Value = &p.v
		p.m.Gauge = &p.g
	}
	p.m.Label = make([]*dto.LabelPair, 0, len(labels))
	for j, val := range labels {
		if val == "" {
			continue // an empty label is an absent one; text, OpenMetrics and protobuf agree
		}
		key := [2]string{f.labels[j], val}
		lp := b.pairs[key]
		if lp == nil {
			lp = &dto.LabelPair{Name: &f.labels[j], Value: &key[1]}
			b.pairs[key] = lp
		}
		p.m.Label = append(p.m.Label, lp)
	}
	m := &p.m
	b.mets[i] = append(b.mets[i], m)
}

// point is a series and its value, allocated together.
type point struct {
	m dto.Metric
	g dto.Gauge
	c dto.Counter
	v float64
}

// families returns the families that have series, in declared order.
func (b *batch) families() []*dto.MetricFamily {
	out := make([]*dto.MetricFamily, 0, len(b.mets))
	for i, ms := range b.mets {
		if len(ms) == 0 {
			continue
		}
		f := &b.c.fams[i]
		typ := dto.MetricType_GAUGE
		if f.typ == counterType {
			typ = dto.MetricType_COUNTER
		}
		out = append(out, &dto.MetricFamily{Name: &f.name, Help: &f.help, Type: &typ, Metric: ms})
	}
	return out
}

// gpuIdent is how dcgm-exporter labels a GPU: gpu is its NVML index,
// pci_bus_id its bus id as NVML's pciInfo.busId writes it.
type gpuIdent struct {
	index, pciBusID string
}

func gpuIdents(gs []share.GPU) map[string]gpuIdent {
	out := make(map[string]gpuIdent, len(gs))
	for _, g := range gs {
		out[g.UUID] = gpuIdent{index: strconv.Itoa(g.Index), pciBusID: dcgmBusID(g.PCI)}
	}
	return out
}

// dcgmBusID writes a PCI address (0000:41:00.0) as DCGM and NVML's
// pciInfo.busId do: an eight-digit domain and upper-case hex
// (00000000:41:00.0). An address it cannot read is kept as it is.
func dcgmBusID(pci string) string {
	dom, rest, ok := strings.Cut(pci, ":")
	if !ok || len(dom) > 8 || strings.Count(rest, ":") != 1 {
		return pci
	}
	if _, err := strconv.ParseUint(dom, 16, 32); err != nil {
		return pci
	}
	return strings.ToUpper(strings.Repeat("0", 8-len(dom)) + dom + ":" + rest)
}

// gpu returns a GPU's labels (gpu, UUID, pci_bus_id) for its UUID. A GPU
// no inventory read has shown yet has only its UUID.
func (b *batch) gpu(uuid string, more ...string) []string {
	id := b.gpus[uuid]
	return append([]string{id.index, uuid, id.pciBusID}, more...)
}

// inst returns an instance's labels (instance_uuid, tenant, gpu, UUID).
func (b *batch) inst(uuid, tenant, gpuUUID string, more ...string) []string {
	return append([]string{uuid, tenant, b.gpus[gpuUUID].index, gpuUUID}, more...)
}
