// Package deps pins the project's chosen dependencies in go.mod while the
// packages that use them are being written. It is removed once each is
// imported by real code.
package deps

import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	_ "github.com/coreos/go-systemd/v22/daemon"
	_ "github.com/digitalocean/go-libvirt"
	_ "github.com/godbus/dbus/v5"
	_ "github.com/google/uuid"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/spf13/cobra"
	_ "github.com/spf13/cobra/doc"
	_ "github.com/vishvananda/netlink"
	_ "go.etcd.io/bbolt"
	_ "golang.org/x/sys/unix"
	_ "libvirt.org/go/libvirtxml"
	_ "sigs.k8s.io/yaml"
)
