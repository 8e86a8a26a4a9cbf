package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/gpu"
)

func inventoryCmd(cfg *config.Config) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "inventory",
		Short: "Discover the host's GPUs through NVML and sysfs and print them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadConfig(cfg, cmd.Flags()); err != nil {
				return err
			}
			if output != "table" && output != "json" && output != "yaml" {
				return usageError{fmt.Errorf("-o %q: want table, json or yaml", output)}
			}
			log := newLogger(cfg)
			h, err := openHost(cfg, log, nil)
			if err != nil {
				return err
			}
			defer h.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			if err := h.nvml.Init(ctx); err != nil {
				return err
			}
			defer h.nvml.Shutdown(context.Background())
			inv, err := discover.Inventory(ctx, h.nvml, h.sysfs)
			if err != nil {
				return fmt.Errorf("discover: %w", err)
			}
			return printInventory(os.Stdout, &inv, output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

func printInventory(w io.Writer, inv *gpu.Inventory, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(inv)
	case "yaml":
		b, err := yaml.Marshal(inv)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	fmt.Fprintf(w, "driver %s (NVML %s), %d GPUs\n\n", inv.Driver.Version, inv.Driver.NVMLVersion, len(inv.GPUs))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IDX\tPCI\tMODEL\tMEMORY\tMIG\tVGPU\tINSTANCES")
	for _, g := range inv.GPUs {
		mig := "-"
		if g.MIG.Capable {
			mig = map[bool]string{true: "on", false: "off"}[g.MIG.Enabled]
			if g.MIG.Pending != g.MIG.Enabled {
				mig += " (pending " + map[bool]string{true: "on", false: "off"}[g.MIG.Pending] + ")"
			}
		}
		vg := string(g.VGPU.Flavour)
		if g.VGPU.TotalVFs > 0 {
			vg += fmt.Sprintf(" %d/%d VFs", g.VGPU.NumVFs, g.VGPU.TotalVFs)
		}
		used := 0
		for _, vf := range g.VGPU.VFs {
			if vf.Type != 0 {
				used++
			}
		}
		inst := fmt.Sprintf("%d GI, %d vGPU", len(g.MIG.Instances), used+len(g.VGPU.Mdevs))
		if g.Lost {
			inst = "LOST"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\n", g.Index, g.PCI, g.Model, g.MemoryBytes>>20, mig, vg, inst)
	}
	tw.Flush()
	for _, g := range inv.GPUs {
		fmt.Fprintf(w, "\n%s %s (%s)\n", g.PCI, g.Product, g.UUID)
		if len(g.MIG.Profiles) > 0 {
			var ps []string
			for _, p := range g.MIG.Profiles {
				var starts []string
				for _, pl := range p.Placements {
					starts = append(starts, fmt.Sprint(pl.Start))
				}
				ps = append(ps, fmt.Sprintf("%s[%s]", p.Name, strings.Join(starts, ",")))
			}
			fmt.Fprintf(w, "  MIG profiles: %s\n", strings.Join(ps, " "))
		}
		if m := g.SlotMap(10); m != "" {
			fmt.Fprintf(w, "  slots %s\n", m)
		}
		for _, gi := range g.MIG.Instances {
			fmt.Fprintf(w, "  GI %d %s at %d+%d, %d CI, %d vGPU\n", gi.ID, gi.Profile, gi.Placement.Start, gi.Placement.Size, len(gi.Compute), gi.VGPUs)
		}
		if len(g.VGPU.Supported) > 0 {
			creatable := map[int]bool{}
			for _, id := range g.VGPU.Creatable {
				creatable[id] = true
			}
			var ts []string
			for _, t := range g.VGPU.Supported {
				mark := ""
				if creatable[t.ID] {
					mark = "*"
				}
				ts = append(ts, strings.TrimPrefix(t.Name, "NVIDIA ")+mark)
			}
			fmt.Fprintf(w, "  vGPU types (* creatable now): %s\n", strings.Join(ts, " "))
		}
		for _, vf := range g.VGPU.VFs {
			if vf.Type != 0 {
				fmt.Fprintf(w, "  VF %s type %d gi %d\n", vf.PCI, vf.Type, vf.GPUInstance)
			}
		}
		for _, m := range g.VGPU.Mdevs {
			owner := ""
			if m.Mdevctl != nil {
				owner = fmt.Sprintf(" (defined by mdevctl, start %s)", m.Mdevctl.Start)
			}
			fmt.Fprintf(w, "  mdev %s on %s type %s%s\n", m.UUID, m.Parent, m.TypeDir, owner)
		}
		for _, e := range g.Errors {
			fmt.Fprintf(w, "  error: %s\n", e)
		}
	}
	return nil
}
