// Command gen writes the dashboards' JSON files (go generate ./dashboards)
// with the Grafana Foundation SDK: typed panels at the SDK's schema, in
// the form Grafana's "export for sharing externally" writes (__inputs for
// the Prometheus data source, __requires for the plugins), so that they
// import as they are and provision with a data source variable.
//
// Imports: dashboards.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vgpud/vgpud/dashboards"
)

func main() {
	dir := flag.String("dir", ".", "directory to write the dashboards to")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	for _, d := range dashboards.All() {
		b, err := render(d)
		if err != nil {
			return fmt.Errorf("dashboard %s: %w", d.UID, err)
		}
		if err := os.WriteFile(filepath.Join(dir, d.File), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
