#include "imatrix.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "common.h"
#include "gguf_writer.h"
#include "quant.h"
#include "text_input.h"

namespace kvrun {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The .dat layout: int32 n_entries; per entry int32 name length, the name, int32 ncall,
// int32 nval, float values[nval] (the mean squares times ncall); then optionally int32
// chunks and the dataset name (int32 length, bytes).
class DatReader {
  public:
    DatReader(std::string bytes, std::string path) : b_(std::move(bytes)), path_(std::move(path)) {}
    int32_t i32(const char* what) {
        int32_t v;
        take(&v, 4, what);
        return v;
    }
    void take(void* dst, size_t n, const char* what) {
        if (b_.size() - at_ < n)
            fail("{}: truncated imatrix file (reading {} at byte {})", path_, what, at_);
        std::memcpy(dst, b_.data() + at_, n);
        at_ += n;
    }
    bool done() const { return at_ == b_.size(); }
    size_t left() const { return b_.size() - at_; }

  private:
    std::string b_, path_;
    size_t at_ = 0;
};

Imatrix load_dat(const std::string& path, std::string bytes) {
    DatReader r(std::move(bytes), path);
    Imatrix im;
    im.counts_are_calls = true;
    const int32_t n = r.i32("the entry count");
    if (n < 0 || size_t(n) > r.left() / 12)
        fail("{}: not an imatrix file (entry count {})", path, n);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t len = r.i32("a name length");
        if (len <= 0 || len > 4096) fail("{}: entry {}: bad name length {}", path, i, len);
        std::string name(size_t(len), '\0');
        r.take(name.data(), name.size(), "a name");
        const int32_t ncall = r.i32("a call count");
        const int32_t nval = r.i32("a value count");
        if (nval <= 0) fail("{}: entry '{}': bad value count {}", path, name, nval);
        if (size_t(nval) > r.left() / 4)
            fail("{}: truncated imatrix file (entry '{}' has {} values, {} bytes are left)", path,
                 name, nval, r.left());
        std::vector<float> v(static_cast<size_t>(nval));
        r.take(v.data(), v.size() * 4, "values");
        Imatrix::Entry e;
        e.n_in = nval;  // the matrix count is not stored: one row of all experts' columns
        e.counts = {double(std::max(ncall, 1))};  // the values are mean squares x ncall
        for (float x : v) {
            if (!std::isfinite(x) || x < 0)
                fail("{}: entry '{}' holds a bad value {}", path, name, x);
            e.sum2.push_back(double(x));
        }
        if (!im.entries.emplace(name, std::move(e)).second)
            fail("{}: entry '{}' appears twice", path, name);
    }
    if (!r.done() && r.left() >= 4) {
        im.chunks = r.i32("the chunk count");
        if (r.left() >= 4) {
            const int32_t len = r.i32("the dataset name length");
            if (len > 0 && size_t(len) <= r.left()) {
                std::string d(size_t(len), '\0');
                r.take(d.data(), d.size(), "the dataset name");
                im.datasets.push_back(d);
            }
        }
    }
    return im;
}

Imatrix load_gguf(const std::string& path) {
    GgufFile f = GgufFile::open(path);
    Imatrix im;
    im.chunks = f.get_int_or("imatrix.chunk_count", 0);
    im.chunk_size = f.get_int_or("imatrix.chunk_size", 0);
    if (const GgufValue* d = f.find("imatrix.datasets"); d && d->type == GgufValueType::ARRAY)
        for (const GgufValue& v : d->as_array())
            if (v.type == GgufValueType::STRING) im.datasets.push_back(v.as_string());
    const std::string sums = ".in_sum2";
    for (const GgufTensorInfo& t : f.tensors()) {
        if (!ends_with(t.name, sums)) continue;
        const std::string name = t.name.substr(0, t.name.size() - sums.size());
        const GgufTensorInfo* c = f.find_tensor(name + ".counts");
        if (!c) f.fail_tensor(t.name, "has no matching .counts tensor");
        if (t.type != GgmlType::F32 || c->type != GgmlType::F32)
            f.fail_tensor(t.name, "imatrix tensors must be F32");
        Imatrix::Entry e;
        e.n_in = t.dims[0];
        const int64_t n_mat = t.n_elements / e.n_in;
        if (c->n_elements != n_mat)
            f.fail_tensor(c->name,
                          fmt::format("holds {} counts for {} matrices", c->n_elements, n_mat));
        std::vector<float> s(static_cast<size_t>(t.n_elements)), k(static_cast<size_t>(n_mat));
        dequantize_row(GgmlType::F32, t.data, s.data(), t.n_elements);
        dequantize_row(GgmlType::F32, c->data, k.data(), n_mat);
        e.sum2.assign(s.begin(), s.end());
        e.counts.assign(k.begin(), k.end());
        for (double v : e.sum2)
            if (!std::isfinite(v) || v < 0)
                f.fail_tensor(t.name, "holds a negative or non-finite sum");
        im.entries.emplace(name, std::move(e));
    }
    if (im.entries.empty())
        fail("{}: no imatrix entries (<name>.in_sum2 tensors) in the file", path);
    return im;
}

}  // namespace

std::vector<float> Imatrix::mean_squares(const std::string& name) const {
    auto it = entries.find(name);
    if (it == entries.end()) return {};
    const Entry& e = it->second;
    std::vector<float> out(e.sum2.size(), 0.0f);
    for (size_t m = 0; m < e.counts.size(); ++m)
        for (int64_t j = 0; j < e.n_in; ++j) {
            const size_t i = m * size_t(e.n_in) + size_t(j);
            if (i < out.size() && e.counts[m] > 0) out[i] = float(e.sum2[i] / e.counts[m]);
        }
    return out;
}

ImatrixCollector::ImatrixCollector(const GgufFile& model, bool include_output) {
    for (const GgufTensorInfo& t : model.tensors()) {
        if (t.dims.size() < 2 || !t.data) continue;
        if (t.name == "token_embd.weight" || (!include_output && t.name == "output.weight"))
            continue;
        Range r;
        r.begin = t.data;
        r.end = t.data + t.n_bytes;
        r.n_in = t.dims[0];
        r.n_mat = t.dims.size() > 2 ? t.dims[2] : 1;
        r.mat_bytes = int64_t(t.n_bytes) / r.n_mat;
        r.name = &t.name;
        ranges_.push_back(r);
    }
    std::sort(ranges_.begin(), ranges_.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
}

void ImatrixCollector::observe(const void* weight, int64_t n_in, const float* x, int64_t n_rows) {
    const auto* p = static_cast<const uint8_t*>(weight);
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), p,
                               [](const uint8_t* q, const Range& r) { return q < r.begin; });
    if (it == ranges_.begin()) return;
    const Range& r = *--it;
    if (p >= r.end || n_in != r.n_in) return;  // not a model tensor (e.g. a LoRA matrix)
    const int64_t m = r.n_mat > 1 ? (p - r.begin) / r.mat_bytes : 0;
    Imatrix::Entry& e = im_.entries[*r.name];
    if (e.sum2.empty()) {
        e.n_in = r.n_in;
        e.sum2.assign(size_t(r.n_mat * r.n_in), 0.0);
        e.counts.assign(size_t(r.n_mat), 0.0);
    }
    double* s = e.sum2.data() + m * r.n_in;
    for (int64_t t = 0; t < n_rows; ++t)
        for (int64_t j = 0; j < n_in; ++j) s[j] += double(x[t * n_in + j]) * x[t * n_in + j];
    e.counts[size_t(m)] += double(n_rows);
}

void ImatrixCollector::add(const Imatrix& other) {
    // The layouts' shapes per tensor: a .dat entry is one row of all experts' columns.
    std::map<std::string, std::pair<int64_t, int64_t>> shape;  // name -> (n_in, n_mat)
    for (const Range& r : ranges_) shape[*r.name] = {r.n_in, r.n_mat};
    // A .dat file counts calls (chunks); weigh them as that many chunks of rows.
    const double rows_per_call =
        other.counts_are_calls ? double(im_.chunk_size > 0 ? im_.chunk_size : 512) : 1.0;
    for (const auto& [name, e0] : other.entries) {
        Imatrix::Entry e = e0;
        for (double& v : e.sum2) v *= rows_per_call;
        for (double& v : e.counts) v *= rows_per_call;
        auto it = shape.find(name);
        if (it != shape.end() && e.counts.size() == 1 && it->second.second > 1 &&
            int64_t(e.sum2.size()) == it->second.first * it->second.second) {
            e.n_in = it->second.first;
            e.counts.assign(size_t(it->second.second), e.counts.front());
        }
        if (e.sum2.size() != size_t(e.n_in) * e.counts.size())
            fail("importance matrix entry '{}': {} values for {} matrices of {} columns", name,
                 e.sum2.size(), e.counts.size(), e.n_in);
        if (it != shape.end() &&
            (e.n_in != it->second.first || int64_t(e.counts.size()) != it->second.second))
            fail(
                "importance matrix entry '{}' is for {} x {} columns; this model's tensor has "
                "{} x {}",
                name, e.counts.size(), e.n_in, it->second.second, it->second.first);
        Imatrix::Entry& into = im_.entries[name];
        if (into.sum2.empty()) {
            into = std::move(e);
            continue;
        }
        if (into.n_in != e.n_in || into.sum2.size() != e.sum2.size())
            fail("importance matrix entry '{}' has {} values here and {} in another file", name,
                 into.sum2.size(), e.sum2.size());
        for (size_t i = 0; i < e.sum2.size(); ++i) into.sum2[i] += e.sum2[i];
        for (size_t m = 0; m < e.counts.size(); ++m) into.counts[m] += e.counts[m];
    }
    im_.chunks += other.chunks;
    if (im_.chunk_size == 0) im_.chunk_size = other.chunk_size;
    im_.datasets.insert(im_.datasets.end(), other.datasets.begin(), other.datasets.end());
}

void save_imatrix(const Imatrix& im, const std::string& path) {
    if (ends_with(path, ".gguf")) {
        GgufWriter w;
        w.set_string("general.type", "imatrix");
        w.set_array_str("imatrix.datasets", im.datasets);
        w.set_u32("imatrix.chunk_count", uint32_t(im.chunks));
        w.set_u32("imatrix.chunk_size", uint32_t(im.chunk_size));
        for (const auto& [name, e] : im.entries) {
            const int64_t n_mat = int64_t(e.counts.size());
            std::vector<float> s(e.sum2.begin(), e.sum2.end()), c(e.counts.begin(), e.counts.end());
            w.add_tensor(name + ".in_sum2", GgmlType::F32, {e.n_in, n_mat}, s.data(), s.size() * 4);
            w.add_tensor(name + ".counts", GgmlType::F32, {1, n_mat}, c.data(), c.size() * 4);
        }
        w.write_file(path);
        return;
    }
    std::string out;
    auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
    auto put_i32 = [&](int64_t v) {
        const int32_t x = int32_t(v);
        put(&x, 4);
    };
    put_i32(int64_t(im.entries.size()));
    const int64_t ncall = std::max<int64_t>(1, im.chunks);
    for (const auto& [name, e] : im.entries) {
        put_i32(int64_t(name.size()));
        put(name.data(), name.size());
        put_i32(ncall);
        put_i32(int64_t(e.sum2.size()));
        for (float v : im.mean_squares(name)) {
            const float x = v * float(ncall);
            put(&x, 4);
        }
    }
    put_i32(im.chunks);
    const std::string dataset = im.datasets.empty() ? "" : im.datasets.front();
    put_i32(int64_t(dataset.size()));
    put(dataset.data(), dataset.size());
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("{}: cannot create: {}", path, std::strerror(errno));
    const size_t written = std::fwrite(out.data(), 1, out.size(), f);
    if (std::fclose(f) != 0 || written != out.size()) fail("{}: write failed", path);
}

Imatrix load_imatrix(const std::string& path) {
    std::string bytes = read_file_text(path);
    if (bytes.size() >= 4 && bytes.compare(0, 4, "GGUF") == 0) return load_gguf(path);
    return load_dat(path, std::move(bytes));
}

}  // namespace kvrun
