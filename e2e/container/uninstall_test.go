package container

import (
	"os"
	"path/filepath"
	"testing"
)

// TestUninstall runs last (go test runs files in name order): dpkg -r
// removes the unit, the bus and polkit files and the activation alias,
// stops vgpud, and keeps /var/lib/vgpud and the changed configuration; a
// reinstall finds the records again; dpkg --purge removes the state.
func TestUninstall(t *testing.T) {
	startVgpud(t)
	ensureTenant(t, "ct-uninstall")
	id := create(t, "1g.10gb", "ct-uninstall")
	in := func(p string) string { return filepath.Join(ct.root, p) }
	shipped := []string{
		"/usr/sbin/vgpud", "/usr/bin/vgpuctl", "/usr/lib/systemd/system/vgpud.service",
		"/usr/share/dbus-1/system.d/dev.vgpud1.conf", "/usr/share/dbus-1/system-services/dev.vgpud1.service",
		"/usr/share/polkit-1/actions/dev.vgpud1.policy", "/etc/systemd/system/dbus-dev.vgpud1.service",
		"/etc/systemd/system/multi-user.target.wants/vgpud.service",
	}

	must(t, "dpkg -r vgpud")
	for _, p := range shipped {
		if _, err := os.Lstat(in(p)); err == nil {
			t.Errorf("dpkg -r left %s", p)
		}
	}
	if s := prop(t, "LoadState") + "/" + prop(t, "ActiveState"); s != "not-found/inactive" {
		t.Errorf("after dpkg -r vgpud.service is %s", s)
	}
	if _, err := os.Stat(in("/var/lib/vgpud/state.db")); err != nil {
		t.Errorf("dpkg -r removed the state: %v", err)
	}
	if out, err := ct.sh(t.Context(), "busctl --system call dev.vgpud1 /dev/vgpud1 org.freedesktop.DBus.Peer Ping"); err == nil {
		t.Errorf("dev.vgpud1 still answers after dpkg -r:\n%s", out)
	}

	must(t, "dpkg -i "+debPath)
	startVgpud(t)
	found := false
	for _, i := range instances(t) {
		found = found || i.UUID == id
	}
	if !found {
		t.Errorf("after a reinstall the record of %s is gone", id)
	}

	must(t, "dpkg --purge vgpud")
	for _, p := range append(shipped, "/var/lib/vgpud", "/etc/vgpud/vgpud.yaml") {
		if _, err := os.Lstat(in(p)); err == nil {
			t.Errorf("dpkg --purge left %s", p)
		}
	}
	// Installed again for anything that runs after.
	must(t, "dpkg -i "+debPath)
}
