package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// stream writes one document per event or refresh: a JSON line, or a YAML
// document after "---".
func (a *app) stream(v any) error {
	switch a.output {
	case "json":
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.out, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.out, "---\n%s", b)
		return err
	}
	return nil
}

func (a *app) eventsCmd() *cobra.Command {
	var count int
	var full bool
	cmd := &cobra.Command{
		Use:   "events [--count N]",
		Short: "Follow vgpud's signals: objects added, removed and changed, operations, GPU loss, VM events",
		Long: `Follow vgpud's signals until interrupted (or --count events): one line per
signal, or with -o json one JSON object per line (JSON Lines). Lines are cut
to 100 columns, and long property values to 24 characters, marked with "~";
--no-trunc prints them whole.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Events run until interrupted: --timeout bounds only connecting.
			ctx := cmd.Context()
			dctx, dcancel := a.ctx(cmd)
			c, err := a.api(dctx)
			dcancel()
			if err != nil {
				return err
			}
			events, err := c.Events(ctx)
			if err != nil {
				return err
			}
			if a.output == "table" {
				fmt.Fprintln(a.out, "# following vgpud's events; interrupt to stop")
			}
			n := 0
			for e := range events {
				if a.output == "table" {
					line := eventLine(e, full)
					if !full {
						line = clip(line, 100)
					}
					fmt.Fprintln(a.out, line)
				} else if err := a.stream(eventDoc{hdr("Event"), e}); err != nil {
					return err
				}
				n++
				if count > 0 && n >= count {
					return nil
				}
			}
			if cmd.Context().Err() != nil {
				return nil
			}
			return &dbusapi.Error{Name: dbusapi.NameUnavailable, Message: "the bus connection closed; is vgpud restarting?"}
		},
	}
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many events (0: follow until interrupted)")
	cmd.Flags().BoolVar(&full, "no-trunc", false, "print whole lines and values (wider than 100 columns)")
	return cmd
}

// eventLine is one event as a line of text; full keeps instance UUIDs
// and property values whole.
func eventLine(e dbusapi.Event, full bool) string {
	id := e.ID
	if e.Kind == "instance" {
		id = short(id, full)
	}
	parts := []string{e.Time.Local().Format("15:04:05.000"), e.Signal, e.Kind, dash(id)}
	if e.Operation != "" {
		parts = append(parts, e.Operation)
	}
	if e.Message != "" {
		parts = append(parts, e.Message)
	}
	if len(e.Changed) > 0 {
		keys := make([]string, 0, len(e.Changed))
		for k := range e.Changed {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			v := fmt.Sprint(e.Changed[k])
			if !full && len(v) > 24 {
				v = v[:23] + "~"
			}
			kv = append(kv, k+"="+v)
		}
		parts = append(parts, strings.Join(kv, " "))
	}
	return strings.Join(parts, " ")
}

// topRow is one instance in top.
type topRow struct {
	Instance      string   `json:"instance"`
	Tenant        string   `json:"tenant"`
	Profile       string   `json:"profile"`
	GPU           string   `json:"gpu"`
	EntitledMilli uint64   `json:"entitledMilli"`
	AchievedMilli *float64 `json:"achievedMilli"`
	DemandMilli   *float64 `json:"demandMilli"`
	Interference  *float64 `json:"interference"`
}

func (a *app) topCmd() *cobra.Command {
	var interval time.Duration
	var iterations int
	cmd := &cobra.Command{
		Use:   "top [--interval 2s] [-n N]",
		Short: "Live per-instance entitled and achieved compute share and interference",
		Long: `Live per-instance compute: ENTITLED is the instance's share in GPUs,
ACHIEVED what it got and DEMAND what it asked for over the share engine's
last window, INTERF its interference index (0 is perfect isolation).
"-" means the share engine does not report it. On a terminal the table is
redrawn every --interval until interrupted; otherwise -n refreshes (default 1)
are printed one after another.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return usagef("--interval %v: at least 100ms", interval)
			}
			n := iterations
			if n < 0 {
				return usagef("-n %d: want 0 (until interrupted) or more", n)
			}
			if !cmd.Flags().Changed("iterations") && !a.isTTY {
				n = 1
			}
			ctx := cmd.Context()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; n == 0 || i < n; i++ {
				if i > 0 {
					select {
					case <-ctx.Done():
						return nil
					case <-tick.C:
					}
				}
				if err := a.topOnce(cmd, i); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "refresh period")
	cmd.Flags().IntVarP(&iterations, "iterations", "n", 0, "refreshes before exiting (0: until interrupted; 1 when not on a terminal)")
	return cmd
}

func (a *app) topOnce(cmd *cobra.Command, i int) error {
	ctx, cancel := a.ctx(cmd)
	defer cancel()
	c, err := a.api(ctx)
	if err != nil {
		return err
	}
	shares, err := c.Shares(ctx)
	if err != nil {
		return err
	}
	insts, err := c.Instances(ctx, "")
	if err != nil {
		return err
	}
	byID := map[string]dbusapi.Instance{}
	for _, in := range insts {
		byID[in.UUID] = in
	}
	rows := []topRow{}
	for _, s := range shares {
		in := byID[s.Instance]
		rows = append(rows, topRow{Instance: s.Instance, Tenant: in.Tenant, Profile: in.Profile, GPU: in.GPU,
			EntitledMilli: s.EntitledMilli, AchievedMilli: s.AchievedMilli, DemandMilli: s.DemandMilli, Interference: s.Interference})
	}
	sort.Slice(rows, func(i, j int) bool {
		ri, rj := interf(rows[i]), interf(rows[j])
		if ri != rj {
			return ri > rj
		}
		return rows[i].Instance < rows[j].Instance
	})
	if a.output != "table" {
		return a.stream(topDoc{hdr("Top"), rows})
	}
	if a.isTTY {
		fmt.Fprint(a.out, "\x1b[H\x1b[2J")
	} else if i > 0 {
		fmt.Fprintln(a.out)
	}
	fmt.Fprintf(a.out, "vgpud top - %s, %d instances\n", time.Now().Format("15:04:05"), len(rows))
	milli := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.3f", *p/1000)
	}
	cells := [][]string{}
	for _, r := range rows {
		in := "-"
		if r.Interference != nil {
			in = fmt.Sprintf("%.2f", *r.Interference)
		}
		cells = append(cells, []string{short(r.Instance, false), dash(r.Tenant), dash(r.Profile), dash(r.GPU), computeOf(r.EntitledMilli), milli(r.AchievedMilli), milli(r.DemandMilli), in})
	}
	return table(a.out, []col{{"INSTANCE", 8}, {"TENANT", 14}, {"PROFILE", 16}, {"GPU", 12}, {"ENTITLED", 8}, {"ACHIEVED", 8}, {"DEMAND", 8}, {"INTERF", 6}}, cells)
}

func interf(r topRow) float64 {
	if r.Interference == nil {
		return -1
	}
	return *r.Interference
}
