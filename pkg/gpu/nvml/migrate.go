package nvml

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The three NVML calls that decide whether a vGPU can move to a GPU
// (nvml.h: nvmlVgpuInstanceGetMetadata, nvmlDeviceGetVgpuMetadata,
// nvmlGetVgpuCompatibility). The metadata travel between hosts as the
// bytes nvml.h lays the structures out in: the fixed fields (little-endian,
// as on every host the driver supports), then the driver's opaque data.

// vgpuFixed is nvmlVgpuMetadata_t without its opaque data (208 bytes).
type vgpuFixed struct {
	Version, Revision, GuestInfoState uint32
	GuestDriverVersion                [80]int8
	HostDriverVersion                 [80]int8
	Reserved                          [6]uint32
	VgpuVirtualizationCaps            uint32
	GuestVgpuVersion, OpaqueDataSize  uint32
}

// pgpuFixed is nvmlVgpuPgpuMetadata_t without its opaque data (124 bytes).
type pgpuFixed struct {
	Version, Revision      uint32
	HostDriverVersion      [80]int8
	PgpuVirtualizationCaps uint32
	Reserved               [5]uint32
	Min, Max               uint32 // HostSupportedVgpuRange
	OpaqueDataSize         uint32
}

// maxOpaque bounds the opaque data a decoded blob may claim: the metadata
// come from another host, and the driver's are a few KiB at most.
const maxOpaque = 64 << 10

// EncodeVGPUMetadata lays m out as nvml.h does.
func EncodeVGPUMetadata(m gonvml.VgpuMetadata) gpu.VGPUMetadata {
	f := vgpuFixed{Version: m.Version, Revision: m.Revision, GuestInfoState: m.GuestInfoState,
		GuestDriverVersion: m.GuestDriverVersion, HostDriverVersion: m.HostDriverVersion, Reserved: m.Reserved,
		VgpuVirtualizationCaps: m.VgpuVirtualizationCaps, GuestVgpuVersion: m.GuestVgpuVersion, OpaqueDataSize: uint32(len(m.OpaqueData))}
	var buf bytes.Buffer
	// Writes into a bytes.Buffer of a struct of fixed-size fields cannot fail.
	_ = binary.Write(&buf, binary.LittleEndian, &f)
	buf.Write(m.OpaqueData)
	return buf.Bytes()
}

// DecodeVGPUMetadata reads a blob EncodeVGPUMetadata wrote; a blob that is
// short, longer than it says or over maxOpaque is gpu.ErrInvalid.
func DecodeVGPUMetadata(b gpu.VGPUMetadata) (gonvml.VgpuMetadata, error) {
	var f vgpuFixed
	var m gonvml.VgpuMetadata
	opaque, err := decodeFixed(b, &f, func() uint32 { return f.OpaqueDataSize })
	if err != nil {
		return m, fmt.Errorf("vGPU metadata: %w", err)
	}
	m.Version, m.Revision, m.GuestInfoState = f.Version, f.Revision, f.GuestInfoState
	m.GuestDriverVersion, m.HostDriverVersion, m.Reserved = f.GuestDriverVersion, f.HostDriverVersion, f.Reserved
	m.VgpuVirtualizationCaps, m.GuestVgpuVersion, m.OpaqueDataSize = f.VgpuVirtualizationCaps, f.GuestVgpuVersion, f.OpaqueDataSize
	m.OpaqueData = opaque
	return m, nil
}

// EncodePGPUMetadata lays m out as nvml.h does.
func EncodePGPUMetadata(m gonvml.VgpuPgpuMetadata) gpu.PGPUMetadata {
	f := pgpuFixed{Version: m.Version, Revision: m.Revision, HostDriverVersion: m.HostDriverVersion,
		PgpuVirtualizationCaps: m.PgpuVirtualizationCaps, Reserved: m.Reserved,
		Min: m.HostSupportedVgpuRange.MinVersion, Max: m.HostSupportedVgpuRange.MaxVersion, OpaqueDataSize: uint32(len(m.OpaqueData))}
	var buf bytes.Buffer
	_ = binary.Write(&buf, binary.LittleEndian, &f)
	buf.Write(m.OpaqueData)
	return buf.Bytes()
}

// DecodePGPUMetadata reads a blob EncodePGPUMetadata wrote (gpu.ErrInvalid
// as DecodeVGPUMetadata).
func DecodePGPUMetadata(b gpu.PGPUMetadata) (gonvml.VgpuPgpuMetadata, error) {
	var f pgpuFixed
	var m gonvml.VgpuPgpuMetadata
	opaque, err := decodeFixed(b, &f, func() uint32 { return f.OpaqueDataSize })
	if err != nil {
		return m, fmt.Errorf("GPU metadata: %w", err)
	}
	m.Version, m.Revision, m.HostDriverVersion = f.Version, f.Revision, f.HostDriverVersion
	m.PgpuVirtualizationCaps, m.Reserved = f.PgpuVirtualizationCaps, f.Reserved
	m.HostSupportedVgpuRange = gonvml.VgpuVersion{MinVersion: f.Min, MaxVersion: f.Max}
	m.OpaqueDataSize, m.OpaqueData = f.OpaqueDataSize, opaque
	return m, nil
}

func decodeFixed(b []byte, f any, size func() uint32) ([]byte, error) {
	n := binary.Size(f)
	if len(b) < n {
		return nil, fmt.Errorf("%w: %d bytes, the fixed part alone is %d", gpu.ErrInvalid, len(b), n)
	}
	// Reading from a bytes.Reader long enough for the struct cannot fail.
	_ = binary.Read(bytes.NewReader(b[:n]), binary.LittleEndian, f)
	if s := size(); s > maxOpaque || int(s) != len(b)-n {
		return nil, fmt.Errorf("%w: says %d bytes of driver data, holds %d", gpu.ErrInvalid, s, len(b)-n)
	}
	return bytes.Clone(b[n:]), nil
}

// VGPUMetadata reads the metadata of a vGPU running on GPU uuid (NVML
// knows a vGPU only while a VM has it open: gpu.ErrNotFound otherwise).
func (b *Backend) VGPUMetadata(ctx context.Context, uuid string, ref gpu.VGPURef) (gpu.VGPUMetadata, error) {
	ctx, release, herr := b.hold(ctx, "VGPUMetadata")
	if herr != nil {
		return gpu.VGPUMetadata{}, herr
	}
	defer release()
	d, err := b.device(ctx, uuid)
	if err != nil {
		return nil, err
	}
	active, err := call(ctx, b, "GetActiveVgpus", d.GetActiveVgpus)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: active vGPUs: %w", uuid, err)
	}
	for _, v := range active {
		ok, err := b.matches(ctx, v, ref)
		if errors.Is(err, gpu.ErrNotFound) {
			continue // its VM stopped meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("GPU %s: active vGPU: %w", uuid, err)
		}
		if !ok {
			continue
		}
		m, err := call(ctx, b, "VgpuInstanceGetMetadata", v.GetMetadata)
		if err != nil {
			return nil, fmt.Errorf("GPU %s: vGPU metadata: %w", uuid, err)
		}
		return EncodeVGPUMetadata(m), nil
	}
	return nil, fmt.Errorf("GPU %s: no running vGPU %s: %w", uuid, refString(ref), gpu.ErrNotFound)
}

func refString(ref gpu.VGPURef) string {
	if ref.MdevUUID != "" {
		return "with mdev " + ref.MdevUUID
	}
	return fmt.Sprintf("of type %d open by VM %s", ref.Type, ref.VMID)
}

// matches says whether the active vGPU v is the one ref names.
func (b *Backend) matches(ctx context.Context, v gonvml.VgpuInstance, ref gpu.VGPURef) (bool, error) {
	if ref.MdevUUID != "" {
		md, err := call(ctx, b, "VgpuInstanceGetMdevUUID", v.GetMdevUUID)
		if errors.Is(err, gpu.ErrNotSupported) {
			return false, nil
		}
		return err == nil && strings.EqualFold(md, ref.MdevUUID), err
	}
	a, err := b.activeVGPU(ctx, v)
	if err != nil {
		return false, err
	}
	return strings.EqualFold(a.VMID, ref.VMID) && a.Type == ref.Type && (ref.GPUInstance < 0 || a.GPUInstance == ref.GPUInstance), nil
}

// PGPUMetadata reads GPU uuid's vGPU metadata (gpu.ErrNotSupported on a
// GPU that hosts no vGPU).
func (b *Backend) PGPUMetadata(ctx context.Context, uuid string) (gpu.PGPUMetadata, error) {
	ctx, release, herr := b.hold(ctx, "PGPUMetadata")
	if herr != nil {
		return gpu.PGPUMetadata{}, herr
	}
	defer release()
	d, err := b.device(ctx, uuid)
	if err != nil {
		return nil, err
	}
	m, err := call(ctx, b, "DeviceGetVgpuMetadata", d.GetVgpuMetadata)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: vGPU metadata: %w", uuid, err)
	}
	return EncodePGPUMetadata(m), nil
}

// VGPUCompatibility asks the driver whether the vGPU vm describes can move
// to the GPU pgpu describes. A blob that does not decode is gpu.ErrInvalid,
// as the driver's INVALID_ARGUMENT. go-nvml hands the C function the fixed
// structures only (4 inline bytes of opaque data, not the OpaqueData
// slice): docs/simulator.md, "The simulated GPU host", says what follows.
func (b *Backend) VGPUCompatibility(ctx context.Context, vm gpu.VGPUMetadata, pgpu gpu.PGPUMetadata) (gpu.Compatibility, error) {
	ctx, release, herr := b.hold(ctx, "VGPUCompatibility")
	if herr != nil {
		return gpu.Compatibility{}, herr
	}
	defer release()
	v, err := DecodeVGPUMetadata(vm)
	if err != nil {
		return gpu.Compatibility{}, err
	}
	p, err := DecodePGPUMetadata(pgpu)
	if err != nil {
		return gpu.Compatibility{}, err
	}
	c, err := call(ctx, b, "GetVgpuCompatibility", func() (gonvml.VgpuPgpuCompatibility, gonvml.Return) {
		return b.lib.GetVgpuCompatibility(&v, &p)
	})
	if err != nil {
		return gpu.Compatibility{}, fmt.Errorf("vGPU compatibility: %w", err)
	}
	return gpu.Compatibility{VM: gpu.VMCompatibility(c.VgpuVmCompatibility), Limit: gpu.CompatLimit(c.CompatibilityLimitCode)}, nil
}
