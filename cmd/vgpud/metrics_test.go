package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/config"
)

// A metrics port another process holds ends the start at once: no state
// is opened, no host touched, no reconcile run.
func TestMetricsPortTakenExitsFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := config.Default()
	cfg.StateDir = filepath.Join(t.TempDir(), "state")
	cfg.MetricsListen = ln.Addr().String()
	err = serve(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "metrics endpoint "+ln.Addr().String()) {
		t.Fatalf("serve with the metrics port taken: %v", err)
	}
	if _, err := os.Stat(cfg.StateDir); !os.IsNotExist(err) {
		t.Fatalf("the state directory was made before the port was checked: %v", err)
	}
}
