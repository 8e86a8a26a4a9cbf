package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// maxLayoutFile bounds what apply reads and sends over the bus.
const maxLayoutFile = 4 << 20

func (a *app) applyCmd() *cobra.Command {
	var file, sel string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply -f FILE [--select NAME] [--dry-run]",
		Short: "Make the host match a layout file (vgpud, NVIDIA mig-parted or vgpu-device-manager format)",
		Long: `Make the host match a layout file: vgpud's own format, or the mig-configs
of NVIDIA mig-parted, or the vgpu-configs of NVIDIA vgpu-device-manager
(--select picks the named config, NAME or NAME@TENANT). The changes are
printed; with --dry-run nothing else happens (the same as plan -f).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if file != "" {
					return usagef("apply: give the file once (-f FILE or FILE)")
				}
				file = args[0]
			}
			if file == "" {
				return usagef("apply: give a layout file with -f FILE (- for stdin)")
			}
			return a.runApply(cmd, file, sel, dryRun)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "layout file (- for stdin)")
	cmd.Flags().StringVar(&sel, "select", "", "named config of a mig-parted or vgpu-device-manager file (NAME or NAME@TENANT)")
	cmd.Flags().StringVar(&sel, "config", "", "same as --select")
	_ = cmd.Flags().MarkHidden("config")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only print the changes")
	_ = cmd.MarkFlagFilename("file", "yaml", "yml", "json")
	return cmd
}

func (a *app) runApply(cmd *cobra.Command, file, sel string, dryRun bool) error {
	var data []byte
	var err error
	name := file
	if file == "-" {
		name = "stdin"
		data, err = io.ReadAll(io.LimitReader(a.in, maxLayoutFile+1))
	} else {
		data, err = os.ReadFile(file)
		name = filepath.Base(file)
	}
	if err != nil {
		return usagef("read %s: %v", file, err)
	}
	if len(data) > maxLayoutFile {
		return usagef("%s is larger than %d MiB; a layout file is a few kilobytes", file, maxLayoutFile>>20)
	}
	ctx, cancel := a.ctx(cmd)
	defer cancel()
	c, err := a.api(ctx)
	if err != nil {
		return err
	}
	res, err := c.Apply(ctx, name, data, sel, dryRun)
	if err != nil {
		return err
	}
	kind := "Apply"
	if dryRun {
		kind = "ApplyPlan"
	}
	return a.emit(applyDoc{hdr(kind), res}, func(w io.Writer) error {
		summary := strings.TrimRight(res.Summary, "\n")
		switch {
		case summary == "":
			// One line, dry run or not: nothing was or would be done.
			fmt.Fprintln(w, "no changes: the host already matches "+name)
			return nil
		case noChanges(res.Changes):
			// Only skipped entries and warnings: they follow the one line.
			fmt.Fprintln(w, "no changes: the host already matches "+name)
			for _, l := range strings.Split(summary, "\n") {
				fmt.Fprintln(w, "  "+l)
			}
			return nil
		default:
			if dryRun {
				fmt.Fprintln(w, "would change:")
			} else {
				fmt.Fprintln(w, "changed:")
			}
			for _, l := range strings.Split(summary, "\n") {
				fmt.Fprintln(w, "  "+l)
			}
		}
		if !dryRun && len(res.Result) > 0 && !bytes.Equal(res.Result, []byte("null")) {
			var r struct {
				Done []json.RawMessage `json:"done"`
			}
			if json.Unmarshal(res.Result, &r) == nil {
				fmt.Fprintf(w, "%d changes done\n", len(r.Done))
			}
		}
		return nil
	})
}

// noChanges reports whether a change set (ApplyOutcome.Changes) holds no
// change: its summary then lists only skipped entries and warnings.
func noChanges(changeSet json.RawMessage) bool {
	var cs struct {
		Changes []json.RawMessage `json:"changes"`
	}
	return json.Unmarshal(changeSet, &cs) == nil && len(cs.Changes) == 0
}
