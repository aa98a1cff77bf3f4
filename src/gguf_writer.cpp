// GGUF v3 serializer: metadata values (checked for type/variant agreement) and tensors laid
// out with aligned offsets, written little-endian exactly as GgufFile parses them.
#include "gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "quant.h"

namespace kvrun {

namespace {

bool is_unsigned_type(GgufValueType t) {
    return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
           t == GgufValueType::UINT64;
}
bool is_signed_type(GgufValueType t) {
    return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
           t == GgufValueType::INT64;
}
bool is_float_type(GgufValueType t) {
    return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

// Throws unless v's variant alternative matches its declared type (recursively).
void check_value(const GgufValue& v, std::string_view key) {
    bool ok = false;
    if (is_unsigned_type(v.type))
        ok = std::holds_alternative<uint64_t>(v.data);
    else if (is_signed_type(v.type))
        ok = std::holds_alternative<int64_t>(v.data);
    else if (is_float_type(v.type))
        ok = std::holds_alternative<double>(v.data);
    else if (v.type == GgufValueType::BOOL)
        ok = std::holds_alternative<bool>(v.data);
    else if (v.type == GgufValueType::STRING)
        ok = std::holds_alternative<std::string>(v.data);
    else if (v.type == GgufValueType::ARRAY) {
        ok = std::holds_alternative<std::vector<GgufValue>>(v.data);
        if (ok) {
            for (const GgufValue& item : std::get<std::vector<GgufValue>>(v.data)) {
                if (item.type != v.array_type)
                    fail("GgufWriter: key '{}': array of {} holds a {} element", key,
                         gguf_value_type_name(v.array_type), gguf_value_type_name(item.type));
                check_value(item, key);
            }
        }
    }
    if (!ok)
        fail("GgufWriter: key '{}': value of type {} holds the wrong kind of data", key,
             gguf_value_type_name(v.type));
}

// Appends little-endian fields to a byte vector.
class Out {
  public:
    explicit Out(std::vector<uint8_t>& buf) : buf_(buf) {}
    template <typename T>
    void put(T v) {
        size_t at = buf_.size();
        buf_.resize(at + sizeof(T));
        std::memcpy(buf_.data() + at, &v, sizeof(T));
    }
    void put_string(std::string_view s) {
        put<uint64_t>(s.size());
        size_t at = buf_.size();
        buf_.resize(at + s.size());
        if (!s.empty()) std::memcpy(buf_.data() + at, s.data(), s.size());
    }
    void pad_to(uint64_t alignment) {
        while (buf_.size() % alignment != 0) buf_.push_back(0);
    }
    void put_value(const GgufValue& v) {
        switch (v.type) {
            case GgufValueType::UINT8:
                put(static_cast<uint8_t>(std::get<uint64_t>(v.data)));
                break;
            case GgufValueType::INT8:
                put(static_cast<int8_t>(std::get<int64_t>(v.data)));
                break;
            case GgufValueType::UINT16:
                put(static_cast<uint16_t>(std::get<uint64_t>(v.data)));
                break;
            case GgufValueType::INT16:
                put(static_cast<int16_t>(std::get<int64_t>(v.data)));
                break;
            case GgufValueType::UINT32:
                put(static_cast<uint32_t>(std::get<uint64_t>(v.data)));
                break;
            case GgufValueType::INT32:
                put(static_cast<int32_t>(std::get<int64_t>(v.data)));
                break;
            case GgufValueType::UINT64:
                put(std::get<uint64_t>(v.data));
                break;
            case GgufValueType::INT64:
                put(std::get<int64_t>(v.data));
                break;
            case GgufValueType::FLOAT32:
                put(static_cast<float>(std::get<double>(v.data)));
                break;
            case GgufValueType::FLOAT64:
                put(std::get<double>(v.data));
                break;
            case GgufValueType::BOOL:
                put<uint8_t>(std::get<bool>(v.data) ? 1 : 0);
                break;
            case GgufValueType::STRING:
                put_string(std::get<std::string>(v.data));
                break;
            case GgufValueType::ARRAY: {
                const auto& items = std::get<std::vector<GgufValue>>(v.data);
                put(static_cast<uint32_t>(v.array_type));
                put<uint64_t>(items.size());
                for (const GgufValue& item : items) put_value(item);
                break;
            }
        }
    }

  private:
    std::vector<uint8_t>& buf_;
};

template <typename T, typename Make>
GgufValue array_of(GgufValueType elem, const std::vector<T>& v, Make make) {
    std::vector<GgufValue> items;
    items.reserve(v.size());
    for (const T& x : v) items.push_back(make(x));
    return gguf_make_array(elem, std::move(items));
}

}  // namespace

GgufValue gguf_make_uint(GgufValueType t, uint64_t v) {
    if (!is_unsigned_type(t)) fail("gguf_make_uint: {} is not unsigned", gguf_value_type_name(t));
    GgufValue out;
    out.type = t;
    out.data = v;
    return out;
}

GgufValue gguf_make_int(GgufValueType t, int64_t v) {
    if (!is_signed_type(t)) fail("gguf_make_int: {} is not signed", gguf_value_type_name(t));
    GgufValue out;
    out.type = t;
    out.data = v;
    return out;
}

GgufValue gguf_make_float(GgufValueType t, double v) {
    if (!is_float_type(t)) fail("gguf_make_float: {} is not a float", gguf_value_type_name(t));
    GgufValue out;
    out.type = t;
    out.data = v;
    return out;
}

GgufValue gguf_make_bool(bool v) {
    GgufValue out;
    out.type = GgufValueType::BOOL;
    out.data = v;
    return out;
}

GgufValue gguf_make_string(std::string v) {
    GgufValue out;
    out.type = GgufValueType::STRING;
    out.data = std::move(v);
    return out;
}

GgufValue gguf_make_array(GgufValueType elem_type, std::vector<GgufValue> items) {
    GgufValue out;
    out.type = GgufValueType::ARRAY;
    out.array_type = elem_type;
    out.data = std::move(items);
    check_value(out, "<array>");
    return out;
}

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
    if (alignment == 0 || !std::has_single_bit(alignment))
        fail("GgufWriter: alignment {} is not a power of two", alignment);
    if (alignment != 32) set_u32("general.alignment", alignment);
}

void GgufWriter::set_value(std::string_view key, GgufValue v) {
    check_value(v, key);
    for (auto& [k, old] : kv_) {
        if (k == key) {
            old = std::move(v);
            return;
        }
    }
    kv_.emplace_back(std::string(key), std::move(v));
}

void GgufWriter::set_u8(std::string_view k, uint8_t v) {
    set_value(k, gguf_make_uint(GgufValueType::UINT8, v));
}
void GgufWriter::set_i8(std::string_view k, int8_t v) {
    set_value(k, gguf_make_int(GgufValueType::INT8, v));
}
void GgufWriter::set_u16(std::string_view k, uint16_t v) {
    set_value(k, gguf_make_uint(GgufValueType::UINT16, v));
}
void GgufWriter::set_i16(std::string_view k, int16_t v) {
    set_value(k, gguf_make_int(GgufValueType::INT16, v));
}
void GgufWriter::set_u32(std::string_view k, uint32_t v) {
    set_value(k, gguf_make_uint(GgufValueType::UINT32, v));
}
void GgufWriter::set_i32(std::string_view k, int32_t v) {
    set_value(k, gguf_make_int(GgufValueType::INT32, v));
}
void GgufWriter::set_u64(std::string_view k, uint64_t v) {
    set_value(k, gguf_make_uint(GgufValueType::UINT64, v));
}
void GgufWriter::set_i64(std::string_view k, int64_t v) {
    set_value(k, gguf_make_int(GgufValueType::INT64, v));
}
void GgufWriter::set_f32(std::string_view k, float v) {
    set_value(k, gguf_make_float(GgufValueType::FLOAT32, v));
}
void GgufWriter::set_f64(std::string_view k, double v) {
    set_value(k, gguf_make_float(GgufValueType::FLOAT64, v));
}
void GgufWriter::set_bool(std::string_view k, bool v) {
    set_value(k, gguf_make_bool(v));
}
void GgufWriter::set_string(std::string_view k, std::string v) {
    set_value(k, gguf_make_string(std::move(v)));
}

void GgufWriter::set_array_str(std::string_view k, const std::vector<std::string>& v) {
    set_value(k, array_of(GgufValueType::STRING, v,
                          [](const std::string& s) { return gguf_make_string(s); }));
}
void GgufWriter::set_array_f32(std::string_view k, const std::vector<float>& v) {
    set_value(k, array_of(GgufValueType::FLOAT32, v,
                          [](float x) { return gguf_make_float(GgufValueType::FLOAT32, x); }));
}
void GgufWriter::set_array_i32(std::string_view k, const std::vector<int32_t>& v) {
    set_value(k, array_of(GgufValueType::INT32, v,
                          [](int32_t x) { return gguf_make_int(GgufValueType::INT32, x); }));
}
void GgufWriter::set_array_u32(std::string_view k, const std::vector<uint32_t>& v) {
    set_value(k, array_of(GgufValueType::UINT32, v,
                          [](uint32_t x) { return gguf_make_uint(GgufValueType::UINT32, x); }));
}
void GgufWriter::set_array_i64(std::string_view k, const std::vector<int64_t>& v) {
    set_value(k, array_of(GgufValueType::INT64, v,
                          [](int64_t x) { return gguf_make_int(GgufValueType::INT64, x); }));
}
void GgufWriter::set_array_u8(std::string_view k, const std::vector<uint8_t>& v) {
    set_value(k, array_of(GgufValueType::UINT8, v,
                          [](uint8_t x) { return gguf_make_uint(GgufValueType::UINT8, x); }));
}
void GgufWriter::set_array_bool(std::string_view k, const std::vector<bool>& v) {
    std::vector<GgufValue> items;
    items.reserve(v.size());
    for (bool b : v) items.push_back(gguf_make_bool(b));
    set_value(k, gguf_make_array(GgufValueType::BOOL, std::move(items)));
}

size_t GgufWriter::check_tensor(std::string_view name, GgmlType type,
                                const std::vector<int64_t>& dims) const {
    if (dims.empty() || dims.size() > 4)
        fail("GgufWriter: tensor '{}' has {} dimensions (must be 1..4)", name, dims.size());
    for (int64_t d : dims)
        if (d < 1) fail("GgufWriter: tensor '{}' has dimension {} (must be >= 1)", name, d);
    for (const Tensor& t : tensors_)
        if (t.name == name) fail("GgufWriter: duplicate tensor name '{}'", name);
    if (!ggml_type_known(static_cast<uint32_t>(type)))
        fail("GgufWriter: tensor '{}' has unknown type id {}", name, static_cast<uint32_t>(type));
    size_t expected = ggml_row_bytes(type, dims[0]);
    for (size_t i = 1; i < dims.size(); ++i) expected *= static_cast<size_t>(dims[i]);
    return expected;
}

void GgufWriter::add_tensor(std::string_view name, GgmlType type, const std::vector<int64_t>& dims,
                            const void* data, size_t bytes) {
    const size_t expected = check_tensor(name, type, dims);
    if (bytes != expected)
        fail("GgufWriter: tensor '{}' ({}) needs {} bytes, got {}", name, ggml_type_name(type),
             expected, bytes);
    if (bytes > 0 && !data) fail("GgufWriter: tensor '{}' has no data", name);
    Tensor t{std::string(name), type, dims, bytes, {}};
    if (bytes > 0) {
        const auto* p = static_cast<const uint8_t*>(data);
        t.data.assign(p, p + bytes);
    }
    tensors_.push_back(std::move(t));
}

size_t GgufWriter::add_tensor_layout(std::string_view name, GgmlType type,
                                     const std::vector<int64_t>& dims) {
    const size_t bytes = check_tensor(name, type, dims);
    tensors_.push_back(Tensor{std::string(name), type, dims, bytes, {}, true});
    return bytes;
}

size_t GgufWriter::padding_after(size_t bytes) const {
    return (alignment_ - bytes % alignment_) % alignment_;
}

std::vector<uint8_t> GgufWriter::header_bytes() const {
    std::vector<uint8_t> buf;
    Out out(buf);
    out.put<uint32_t>(kGgufMagic);
    out.put<uint32_t>(3);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(kv_.size());
    for (const auto& [key, v] : kv_) {
        out.put_string(key);
        out.put(static_cast<uint32_t>(v.type));
        out.put_value(v);
    }
    uint64_t offset = 0;  // relative to the data section; each tensor starts aligned
    for (const Tensor& t : tensors_) {
        out.put_string(t.name);
        out.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
        for (int64_t d : t.dims) out.put<uint64_t>(static_cast<uint64_t>(d));
        out.put<uint32_t>(static_cast<uint32_t>(t.type));
        out.put<uint64_t>(offset);
        offset += t.bytes + padding_after(t.bytes);
    }
    out.pad_to(alignment_);
    return buf;
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
    std::vector<uint8_t> buf = header_bytes();
    for (const Tensor& t : tensors_) {
        if (t.layout_only) fail("GgufWriter: tensor '{}' was declared without data", t.name);
        buf.insert(buf.end(), t.data.begin(), t.data.end());
        buf.resize(buf.size() + padding_after(t.bytes), 0);
    }
    return buf;
}

void GgufWriter::write_file(const std::string& path) const {
    std::vector<uint8_t> bytes = to_bytes();
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail("{}: cannot create: {}", path, std::strerror(errno));
    size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
    int err = errno;
    if (std::fclose(f) != 0 || written != bytes.size())
        fail("{}: write failed: {}", path, std::strerror(err ? err : errno));
}

}  // namespace kvrun
