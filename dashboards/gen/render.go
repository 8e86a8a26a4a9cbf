package main

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	sdk "github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"

	"github.com/vgpud/vgpud/dashboards"
)

// dsInput is the import input that binds the data source; the
// datasource variable defaults to it, and every panel and query uses the
// variable, so a provisioned copy picks any Prometheus.
const dsInput = "DS_PROMETHEUS"

// grafanaVersion is the oldest Grafana the dashboards need: the SDK's
// schema (42) and typed panels are Grafana 11's.
const grafanaVersion = "11.0.0"

func str(s string) *string { return &s }

var ds = common.DataSourceRef{Type: str("prometheus"), Uid: str("${datasource}")}

// render builds one dashboard and writes it in the export form.
//
// The SDK marks its classic dashboard model deprecated in favour of
// dashboardv2, the resource form Grafana 12 stores behind a feature flag;
// the classic JSON (schema 42) is what every Grafana 11 and 12 imports,
// and the only form with __inputs and __requires, so the generator keeps it.
func render(d dashboards.Dashboard) ([]byte, error) {
	//lint:ignore SA1019 the classic model is the importable one (above)
	b := sdk.NewDashboardBuilder(d.Title).Uid(d.UID).Tags(d.Tags).Editable().
		Tooltip(sdk.DashboardCursorSyncCrosshair).Time("now-1h", "now").Refresh("10s").Timezone("browser").
		Version(1).
		WithVariable(sdk.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus").
			Current(sdk.VariableOption{Text: sdk.StringOrArrayOfString{String: str("${" + dsInput + "}")},
				Value: sdk.StringOrArrayOfString{String: str("${" + dsInput + "}")}}))
	for _, v := range d.Vars {
		q := v.Query
		vb := sdk.NewQueryVariableBuilder(v.Name).Label(v.Label).Datasource(ds).
			Query(sdk.StringOrMap{String: &q}).Definition(v.Query).
			Refresh(sdk.VariableRefreshOnTimeRangeChanged).Multi(true).IncludeAll(true).AllValue(".+").
			Sort(sdk.VariableSortNaturalAsc)
		if v.Regex != "" {
			vb = vb.Regex(v.Regex)
		}
		b = b.WithVariable(vb)
	}
	plugins := map[string]string{}
	x, y, rowH := 0, 0, 0
	for i, p := range d.Panels {
		if x+p.W > 24 {
			x, y, rowH = 0, y+rowH, 0
		}
		pos := sdk.GridPos{X: uint32(x), Y: uint32(y), W: uint32(p.W), H: uint32(p.H)}
		pb, name, err := panel(p, uint32(i+1), pos)
		if err != nil {
			return nil, fmt.Errorf("panel %q: %w", p.Title, err)
		}
		plugins[p.Type] = name
		b = b.WithPanel(pb)
		x += p.W
		rowH = max(rowH, p.H)
	}
	dash, err := b.Build()
	if err != nil {
		return nil, err
	}
	return export(dash, plugins)
}

// panel builds one typed panel; it returns the plugin's display name too.
func panel(p dashboards.Panel, id uint32, pos sdk.GridPos) (cog.Builder[sdk.Panel], string, error) {
	unit := p.Unit
	if unit == "" {
		unit = "short"
	}
	var targets []cog.Builder[variants.Dataquery]
	for j, t := range p.Targets {
		q := prometheus.NewDataqueryBuilder().RefId(string(rune('A' + j))).Expr(t.Expr).Datasource(ds).LegendFormat(t.Legend)
		if t.Legend == "" {
			q = q.LegendFormat("__auto")
		}
		if p.Instant {
			q = q.Instant().Format(prometheus.PromQueryFormatTable)
		}
		targets = append(targets, q)
	}
	switch p.Type {
	case "timeseries":
		b := timeseries.NewPanelBuilder().Id(id).Title(p.Title).Datasource(ds).GridPos(pos).Unit(unit).
			DrawStyle(common.GraphDrawStyleLine).LineWidth(1).FillOpacity(10).ShowPoints(common.VisibilityModeNever).
			Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeTable).Placement(common.LegendPlacementBottom).ShowLegend(true)).
			Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))
		if p.Stack {
			b = b.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A")).FillOpacity(40)
		}
		if p.Min != nil {
			b = b.Min(*p.Min)
		}
		if p.Max != nil {
			b = b.Max(*p.Max)
		}
		if p.Description != "" {
			b = b.Description(p.Description)
		}
		for _, t := range targets {
			b = b.WithTarget(t)
		}
		return b, "Time series", nil
	case "stat":
		b := stat.NewPanelBuilder().Id(id).Title(p.Title).Datasource(ds).GridPos(pos).Unit(unit).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
			ColorMode(common.BigValueColorModeValue).GraphMode(common.BigValueGraphModeNone)
		if p.Description != "" {
			b = b.Description(p.Description)
		}
		for _, t := range targets {
			b = b.WithTarget(t)
		}
		return b, "Stat", nil
	case "table":
		b := table.NewPanelBuilder().Id(id).Title(p.Title).Datasource(ds).GridPos(pos).Unit(unit).ShowHeader(true).
			WithTransformation(sdk.DataTransformerConfig{Id: "merge", Options: map[string]any{}})
		if p.Description != "" {
			b = b.Description(p.Description)
		}
		for _, t := range targets {
			b = b.WithTarget(t)
		}
		return b, "Table", nil
	}
	return nil, "", fmt.Errorf("panel type %q is not one the generator builds (timeseries, stat, table)", p.Type)
}

type requirement struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Name    string `json:"name"`
	Version string `json:"version"`
}

// export adds what Grafana's export for sharing writes beside the
// dashboard model: the data source input and the plugins required.
//
//lint:ignore SA1019 the classic model is the importable one (render)
func export(d sdk.Dashboard, plugins map[string]string) ([]byte, error) {
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	doc["__inputs"] = []map[string]string{{"name": dsInput, "label": "Prometheus", "description": "The Prometheus that scrapes vgpud",
		"type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}}
	reqs := []requirement{{Type: "grafana", ID: "grafana", Name: "Grafana", Version: grafanaVersion},
		{Type: "datasource", ID: "prometheus", Name: "Prometheus", Version: "1.0.0"}}
	ids := make([]string, 0, len(plugins))
	for id := range plugins {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		reqs = append(reqs, requirement{Type: "panel", ID: id, Name: plugins[id], Version: ""})
	}
	doc["__requires"] = reqs
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
