package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/vgpud/vgpud/pkg/version"
)

// genDocsCmd writes vgpud's man pages (section 8: a system daemon) from
// the command definitions, so they never drift from the binary.
func genDocsCmd() *cobra.Command {
	var manDir string
	cmd := &cobra.Command{
		Use:    "gen-docs --man DIR",
		Short:  "Write vgpud's man pages",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if manDir == "" {
				return usageError{fmt.Errorf("--man DIR is required")}
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true
			hdr := &doc.GenManHeader{Title: "VGPUD", Section: "8", Source: "vgpud " + version.Version, Manual: "vgpud manual"}
			return doc.GenManTree(root, hdr, manDir)
		},
	}
	cmd.Flags().StringVar(&manDir, "man", "", "directory for the man pages")
	return cmd
}
