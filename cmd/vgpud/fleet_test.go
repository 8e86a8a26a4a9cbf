package main

import (
	"testing"
	"time"
)

func TestConfigFleetSection(t *testing.T) {
	c, err := loadWith(t, "version: v1\nfleet:\n  endpoint: http://127.0.0.1:8778\n  host: gpu-7\n  syncInterval: 30s\n  grace: 90s\n  parentUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d2\n")
	if err != nil {
		t.Fatal(err)
	}
	f := c.Fleet
	if f == nil || f.Endpoint != "http://127.0.0.1:8778" || f.Host != "gpu-7" || f.SyncInterval.Duration != 30*time.Second || f.Grace.Duration != 90*time.Second || f.ParentUUID == "" {
		t.Fatalf("fleet = %+v", f)
	}
	if _, err := loadWith(t, "version: v1\nfleet:\n  endpont: x\n"); err == nil {
		t.Fatal("a misspelt fleet key was accepted")
	}
	for _, bad := range []string{
		"fleet:\n  endpoint: placement:8778\n",
		"fleet:\n  endpoint: http://p:8778\n  parentUUID: nope\n",
		"fleet:\n  endpoint: http://p:8778\n  grace: -1s\n",
		"fleet:\n  endpoint: http://p:8778\n  rootUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d2\n  parentUUID: 9a0e0c3c-0d6f-4a11-8b2e-6f1c2b9e51d3\n",
	} {
		if _, err := loadWith(t, "version: v1\n"+bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if !reloadableKeys["fleet"] {
		t.Fatal("fleet is not applied on SIGHUP")
	}
}
