// Measured device-to-device copy bandwidth of the current CUDA device (plain C++ header).
#pragma once

namespace kvrun {

// Bytes read + written per second by cudaMemcpy of a large buffer within the current
// device (best of a few runs): the practical ceiling for a memory-bound decode step.
double cuda_copy_bandwidth();

}  // namespace kvrun
