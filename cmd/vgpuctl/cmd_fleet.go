package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// fleetDoc is `vgpuctl fleet status -o json`.
type fleetDoc struct {
	header
	Fleet dbusapi.FleetStatus `json:"fleet"`
}

func (a *app) fleetCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "fleet",
		Short: "The host in OpenStack Placement (fleet: in vgpud.yaml)",
	}
	c.AddCommand(a.fleetStatusCmd())
	return c
}

func (a *app) fleetStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "What Placement holds against what the host holds, differences named",
		Long: `Compares OpenStack Placement with the host now: the GPU providers, their
inventories (host total/reserved against Placement's total/reserved/used)
and allocations, and names every difference (provider-missing,
provider-stale, inventory-missing, inventory-stale, inventory-differs,
traits-differ, allocation-missing, allocation-stale, allocation-differs,
write-failed: a write the last sync pass could not make).
It only reads; vgpud's sync repairs differences at its next pass. An
allocation a fleet scheduler wrote for a create still on its way shows as
allocation-stale until the create adopts it. Unavailable (exit 10) when no
fleet is configured or Placement does not answer.`,
		Args: cobra.NoArgs,
		RunE: a.withAPI(func(ctx context.Context, c api, cmd *cobra.Command, args []string) error {
			st, err := c.FleetStatus(ctx)
			if err != nil {
				return err
			}
			return a.emit(fleetDoc{hdr("FleetStatus"), st}, func(w io.Writer) error { return fleetTable(w, st) })
		}),
	}
}

func fleetTable(w io.Writer, st dbusapi.FleetStatus) error {
	last := "never"
	if st.LastSync != nil {
		last = st.LastSync.Local().Format(time.RFC3339) + " (" + time.Since(*st.LastSync).Round(time.Second).String() + " ago)"
	}
	kv := [][2]string{{"Placement", st.Endpoint}, {"Host", st.Host}, {"Root provider", st.Root}, {"Last sync", last}}
	if st.LastError != "" {
		kv = append(kv, [2]string{"Last error", st.LastError})
	}
	writeKV(w, kv)
	fmt.Fprintln(w)
	// INST: instances on the host / allocations in Placement; T/R/U:
	// total, reserved, used.
	var rows [][]string
	for _, p := range st.Providers {
		in := "yes"
		if !p.InPlacement {
			in = "MISSING"
		}
		for i, k := range p.Classes {
			name, inst := "", ""
			if i == 0 {
				name, inst = p.Name, fmt.Sprintf("%d/%d", p.HostAllocations, p.PlacementAllocations)
			}
			pl := "-"
			if p.InPlacement {
				pl = fmt.Sprintf("%d/%d/%d", k.PlacementTotal, k.PlacementReserved, k.PlacementUsed)
			}
			rows = append(rows, []string{name, in, inst, k.Class, fmt.Sprintf("%d/%d", k.HostTotal, k.HostReserved), pl})
			in = ""
		}
	}
	if err := table(w, []col{{"PROVIDER", 26}, {"IN", 7}, {"INST", 5}, {"CLASS", 28}, {"HOST T/R", 8}, {"PL T/R/U", 9}}, rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(st.Differences) == 0 {
		fmt.Fprintln(w, "In sync: Placement holds what the host holds.")
		return nil
	}
	plural := "s"
	if len(st.Differences) == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "%d difference%s (the sync repairs them at its next pass):\n", len(st.Differences), plural)
	for _, d := range st.Differences {
		fmt.Fprintln(w, clip(fmt.Sprintf("  %-18s  %s  %s", d.Kind, d.Provider, d.Subject), 100))
		fmt.Fprintln(w, clip(fmt.Sprintf("      host: %s; placement: %s", d.Host, d.Placement), 100))
	}
	return nil
}
