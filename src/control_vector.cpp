// Control vectors (see control_vector.h).
#include "control_vector.h"

#include <cmath>
#include <cstdio>

#include "common.h"
#include "gguf.h"
#include "quant.h"

namespace kvrun {

ControlVector control_vector_load(const ControlVectorOptions& o, const ModelConfig& c) {
    ControlVector cv;
    if (o.specs.empty()) return cv;
    const int64_t n_layer = c.n_layer, n_embd = c.n_embd;
    if (o.layer_start >= 0 || o.layer_end >= 0) {
        if (o.layer_start < 0 || o.layer_end < o.layer_start || o.layer_end >= n_layer)
            fail(
                "--control-vector-layer-range {} {}: expected 0 <= START <= END < {} (the "
                "model's layers)",
                o.layer_start, o.layer_end, n_layer);
    }
    cv.values.assign(size_t(n_layer * n_embd), 0.0f);
    cv.steered.assign(size_t(n_layer), false);
    std::vector<float> row(static_cast<size_t>(n_embd));
    for (const ControlVectorSpec& spec : o.specs) {
        if (!std::isfinite(spec.scale))
            fail("control vector scale {} for {} is not finite", spec.scale, spec.path);
        GgufFile f = GgufFile::open(spec.path);
        const std::string arch = f.get_string_or("general.architecture", "");
        if (arch != "controlvector")
            throw Error(fmt::format("{} is not a control vector (general.architecture '{}')",
                                    spec.path, arch),
                        "--control-vector takes llama.cpp's control vector GGUF files");
        if (f.tensors().empty()) fail("{}: the control vector has no directions", spec.path);
        for (const GgufTensorInfo& t : f.tensors()) {
            int layer = -1, end = 0;
            if (std::sscanf(t.name.c_str(), "direction.%d%n", &layer, &end) != 1 ||
                size_t(end) != t.name.size())
                fail("{}: tensor '{}' is not a direction (direction.LAYER)", spec.path, t.name);
            if (layer < 1 || layer >= n_layer)
                fail(
                    "{}: '{}' steers layer {}, but the model's layers that can be steered are "
                    "1..{}",
                    spec.path, t.name, layer, n_layer - 1);
            if (t.n_elements != n_embd || (t.type != GgmlType::F32 && t.type != GgmlType::F16))
                fail(
                    "{}: '{}' must be {} F32 or F16 values (the model's embedding size), not {} "
                    "{}",
                    spec.path, t.name, n_embd, t.n_elements, ggml_type_name(t.type));
            if (o.layer_start >= 0 && (layer < o.layer_start || layer > o.layer_end)) continue;
            dequantize_row(t.type, t.data, row.data(), n_embd);
            float* v = cv.values.data() + size_t(layer) * size_t(n_embd);
            for (int64_t i = 0; i < n_embd; ++i) v[i] += spec.scale * row[size_t(i)];
            cv.steered[size_t(layer)] = true;
        }
    }
    return cv;
}

}  // namespace kvrun
