// Importance matrices (llama-imatrix): for every weight matrix, the mean square of each
// input column's activations over a calibration text. Quantizing with them weights each
// weight's rounding error by how much its column matters to the products
// (quantize_row_weighted). Files: llama.cpp's GGUF imatrix (<name>.in_sum2 / <name>.counts
// tensors) and its older .dat layout, both read and written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gguf.h"

namespace kvrun {

struct Imatrix {
    struct Entry {
        int64_t n_in = 0;            // columns of one matrix
        std::vector<double> sum2;    // [n_mat][n_in]: sums of x^2 (n_mat: experts, or 1)
        std::vector<double> counts;  // [n_mat]: activation rows summed
    };
    std::map<std::string, Entry> entries;  // by weight tensor name
    int64_t chunks = 0, chunk_size = 0;
    std::vector<std::string> datasets;
    bool counts_are_calls = false;  // read from a .dat file: counts are its calls, not rows

    // Mean squares [n_mat][n_in] of a tensor (empty when absent; an unseen expert's row is
    // all zeros).
    std::vector<float> mean_squares(const std::string& name) const;
};

// Collects an Imatrix from a backend's matmul observer (Backend::set_matmul_observer).
class ImatrixCollector {
  public:
    // The model whose tensor data the observed weights point into. The output projection
    // is left out unless include_output (llama-imatrix's --process-output).
    ImatrixCollector(const GgufFile& model, bool include_output);
    void observe(const void* weight, int64_t n_in, const float* x, int64_t n_rows);
    // Adds another imatrix's sums and counts (llama-imatrix's --in-file); throws Error when
    // an entry's shape differs from what is collected here.
    void add(const Imatrix& other);
    Imatrix& result() { return im_; }

  private:
    struct Range {
        const uint8_t *begin = nullptr, *end = nullptr;
        const std::string* name = nullptr;
        int64_t n_in = 0, n_mat = 1, mat_bytes = 0;
    };
    std::vector<Range> ranges_;  // sorted by begin
    Imatrix im_;
};

// Writes llama.cpp's GGUF imatrix when the path ends in .gguf, else its .dat layout.
void save_imatrix(const Imatrix& im, const std::string& path);
// Reads either layout (by content). Throws Error (GgufError) naming the file and the problem.
Imatrix load_imatrix(const std::string& path);

}  // namespace kvrun
