package metrics

import (
	"strconv"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ReturnCode is an NVML return code as a metric label ("" for success),
// for ObserveNVML.
func ReturnCode(ret gonvml.Return) string {
	switch ret {
	case gonvml.SUCCESS:
		return ""
	case gonvml.ERROR_NOT_SUPPORTED:
		return "not_supported"
	case gonvml.ERROR_INVALID_ARGUMENT:
		return "invalid_argument"
	case gonvml.ERROR_NOT_FOUND:
		return "not_found"
	case gonvml.ERROR_GPU_IS_LOST:
		return "gpu_is_lost"
	case gonvml.ERROR_TIMEOUT:
		return "timeout"
	case gonvml.ERROR_IN_USE:
		return "in_use"
	case gonvml.ERROR_INSUFFICIENT_RESOURCES:
		return "insufficient_resources"
	case gonvml.ERROR_UNINITIALIZED:
		return "uninitialized"
	case gonvml.ERROR_NO_PERMISSION:
		return "no_permission"
	case gonvml.ERROR_RESET_REQUIRED:
		return "reset_required"
	case gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED:
		return "driver_not_loaded"
	case gonvml.ERROR_ARGUMENT_VERSION_MISMATCH:
		return "argument_version_mismatch"
	case gonvml.ERROR_UNKNOWN:
		return "unknown"
	}
	return "code_" + strconv.Itoa(int(ret))
}
