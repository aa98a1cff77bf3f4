// GGUF v2/v3 reader: maps the file read-only and parses header, metadata and tensor table
// with a bounds-checked cursor. Every count is checked against the bytes left before
// anything is allocated, tensor data must lie inside the data section without overlapping,
// and every failure names the file, the key/tensor and the offset.
#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

#include "quant.h"

namespace kvrun {

static_assert(std::endian::native == std::endian::little,
              "kvrun reads GGUF on little-endian hosts");

namespace {

constexpr int kMaxArrayDepth = 16;  // nested arrays deeper than this are rejected
// Cap on array elements summed over all metadata: each costs ~50 bytes in memory, so this
// bounds a hostile file's metadata to about 1 GiB (real vocabularies use ~1M).
constexpr uint64_t kMaxTotalArrayElements = uint64_t{1} << 24;
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;

// s with control characters, quotes and backslashes escaped, cut after `max_chars`
// characters (hostile names must not flood or drive the terminal).
std::string escaped(std::string_view s, size_t max_chars) {
    std::string out;
    size_t n = 0;
    for (char ch : s) {
        if (n++ >= max_chars) {
            out += "...";
            break;
        }
        auto c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += ch;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            out += fmt::format("\\x{:02x}", c);
        } else {
            out += ch;
        }
    }
    return out;
}

std::string quote(std::string_view s, size_t max_chars) {
    return "\"" + escaped(s, max_chars) + "\"";
}

// Smallest encoding of one value of type t (used to reject implausible counts).
uint64_t min_value_bytes(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL:
            return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16:
            return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32:
            return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64:
        case GgufValueType::STRING:
            return 8;  // length prefix
        case GgufValueType::ARRAY:
            return 12;  // element type + count
    }
    return 1;
}

bool value_type_valid(uint32_t t) {
    return t <= static_cast<uint32_t>(GgufValueType::FLOAT64);
}

// Bounds-checked little-endian reader over [base, base+size). Errors carry a context
// ("key 'x'", "tensor 'y'", "header") and the offset where the bad field starts.
class Cursor {
  public:
    Cursor(const uint8_t* base, uint64_t size, const std::string& path)
        : base_(base), size_(size), path_(path) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }
    void set_context(std::string ctx) { context_ = std::move(ctx); }

    [[noreturn]] void fail_at(uint64_t offset, std::string what) const {
        throw GgufError(path_, std::move(what), context_, offset);
    }

    void need(uint64_t n, const char* what) const {
        if (n > remaining())
            fail_at(pos_, fmt::format("file truncated: {} needs {} bytes, only {} left", what, n,
                                      remaining()));
    }

    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(const char* what) {
        uint64_t at = pos_;
        uint64_t len = read<uint64_t>(what);
        if (len > remaining())
            fail_at(at, fmt::format("{} length {} runs past the end of the file ({} bytes left)",
                                    what, len, remaining()));
        std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return s;
    }

  private:
    const uint8_t* base_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& path_;
    std::string context_;
};

// Parses metadata values; tracks the total array elements across the whole file.
class ValueParser {
  public:
    explicit ValueParser(Cursor& c) : c_(c) {}

    GgufValueType read_type(const char* what) {
        uint64_t at = c_.pos();
        uint32_t t = c_.read<uint32_t>(what);
        if (!value_type_valid(t)) c_.fail_at(at, fmt::format("unknown value type {}", t));
        return static_cast<GgufValueType>(t);
    }

    GgufValue read_value(GgufValueType type, int depth) {
        GgufValue v;
        v.type = type;
        switch (type) {
            case GgufValueType::UINT8:
                v.data = uint64_t{c_.read<uint8_t>("uint8 value")};
                break;
            case GgufValueType::INT8:
                v.data = int64_t{c_.read<int8_t>("int8 value")};
                break;
            case GgufValueType::UINT16:
                v.data = uint64_t{c_.read<uint16_t>("uint16 value")};
                break;
            case GgufValueType::INT16:
                v.data = int64_t{c_.read<int16_t>("int16 value")};
                break;
            case GgufValueType::UINT32:
                v.data = uint64_t{c_.read<uint32_t>("uint32 value")};
                break;
            case GgufValueType::INT32:
                v.data = int64_t{c_.read<int32_t>("int32 value")};
                break;
            case GgufValueType::UINT64:
                v.data = c_.read<uint64_t>("uint64 value");
                break;
            case GgufValueType::INT64:
                v.data = c_.read<int64_t>("int64 value");
                break;
            case GgufValueType::FLOAT32:
                v.data = double{c_.read<float>("float32 value")};
                break;
            case GgufValueType::FLOAT64:
                v.data = c_.read<double>("float64 value");
                break;
            case GgufValueType::BOOL: {
                uint64_t at = c_.pos();
                uint8_t b = c_.read<uint8_t>("bool value");
                if (b > 1) c_.fail_at(at, fmt::format("bool value is {} (must be 0 or 1)", b));
                v.data = b != 0;
                break;
            }
            case GgufValueType::STRING:
                v.data = c_.read_string("string");
                break;
            case GgufValueType::ARRAY:
                read_array(v, depth);
                break;
        }
        return v;
    }

  private:
    void read_array(GgufValue& v, int depth) {
        uint64_t at = c_.pos();
        if (depth >= kMaxArrayDepth)
            c_.fail_at(at, fmt::format("arrays nested more than {} deep", kMaxArrayDepth));
        v.array_type = read_type("array element type");
        uint64_t count_at = c_.pos();
        uint64_t count = c_.read<uint64_t>("array length");
        uint64_t min_bytes = min_value_bytes(v.array_type);
        if (count > c_.remaining() / min_bytes)
            c_.fail_at(count_at,
                       fmt::format("array length {} of {} is impossible: only {} "
                                   "bytes left in the file (truncated or corrupt file)",
                                   count, gguf_value_type_name(v.array_type), c_.remaining()));
        total_elements_ += count;
        if (total_elements_ > kMaxTotalArrayElements)
            c_.fail_at(count_at, fmt::format("metadata arrays hold more than {} elements in total",
                                             kMaxTotalArrayElements));
        std::vector<GgufValue> items;
        items.reserve(static_cast<size_t>(count));
        for (uint64_t i = 0; i < count; ++i) items.push_back(read_value(v.array_type, depth + 1));
        v.data = std::move(items);
    }

    Cursor& c_;
    uint64_t total_elements_ = 0;
};

std::string type_mismatch(const GgufValue& v, const char* expected) {
    return fmt::format("has type {}, expected {}", gguf_value_type_name(v.type), expected);
}

std::string key_where(std::string_view key) {
    return fmt::format("key '{}'", escaped(key, 96));
}

std::string tensor_where(std::string_view name) {
    return fmt::format("tensor '{}'", escaped(name, 96));
}

std::string gguf_error_message(const std::string& file, const std::string& problem,
                               const std::string& where, std::optional<uint64_t> offset) {
    std::string msg = file.empty() ? problem : file + ": " + problem;
    if (!where.empty() && offset)
        return msg + fmt::format(" ({}, at byte offset {})", where, *offset);
    if (!where.empty()) return msg + " (" + where + ")";
    if (offset) return msg + fmt::format(" (at byte offset {})", *offset);
    return msg;
}

}  // namespace

GgufError::GgufError(std::string file, std::string problem, std::string where,
                     std::optional<uint64_t> offset)
    : Error(gguf_error_message(file, problem, where, offset)),
      file_(std::move(file)),
      problem_(std::move(problem)),
      where_(std::move(where)),
      offset_(offset) {}

const char* gguf_value_type_name(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
            return "uint8";
        case GgufValueType::INT8:
            return "int8";
        case GgufValueType::UINT16:
            return "uint16";
        case GgufValueType::INT16:
            return "int16";
        case GgufValueType::UINT32:
            return "uint32";
        case GgufValueType::INT32:
            return "int32";
        case GgufValueType::FLOAT32:
            return "float32";
        case GgufValueType::BOOL:
            return "bool";
        case GgufValueType::STRING:
            return "string";
        case GgufValueType::ARRAY:
            return "array";
        case GgufValueType::UINT64:
            return "uint64";
        case GgufValueType::INT64:
            return "int64";
        case GgufValueType::FLOAT64:
            return "float64";
    }
    return "unknown";
}

// ---- GgufValue ----------------------------------------------------------------------

bool GgufValue::is_int() const {
    return std::holds_alternative<uint64_t>(data) || std::holds_alternative<int64_t>(data);
}

bool GgufValue::is_float() const {
    return type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64;
}

int64_t GgufValue::as_int() const {
    if (auto* u = std::get_if<uint64_t>(&data)) {
        if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw GgufError({}, fmt::format("uint64 value {} does not fit in int64", *u));
        return static_cast<int64_t>(*u);
    }
    if (auto* i = std::get_if<int64_t>(&data)) return *i;
    if (auto* b = std::get_if<bool>(&data)) return *b ? 1 : 0;
    throw GgufError({},
                    fmt::format("value of type {} is not an integer", gguf_value_type_name(type)));
}

double GgufValue::as_float() const {
    if (auto* d = std::get_if<double>(&data)) return *d;
    if (auto* u = std::get_if<uint64_t>(&data)) return static_cast<double>(*u);
    if (auto* i = std::get_if<int64_t>(&data)) return static_cast<double>(*i);
    throw GgufError({},
                    fmt::format("value of type {} is not a number", gguf_value_type_name(type)));
}

bool GgufValue::as_bool() const {
    if (auto* b = std::get_if<bool>(&data)) return *b;
    throw GgufError({}, fmt::format("value of type {} is not a bool", gguf_value_type_name(type)));
}

const std::string& GgufValue::as_string() const {
    if (auto* s = std::get_if<std::string>(&data)) return *s;
    throw GgufError({},
                    fmt::format("value of type {} is not a string", gguf_value_type_name(type)));
}

const std::vector<GgufValue>& GgufValue::as_array() const {
    if (auto* a = std::get_if<std::vector<GgufValue>>(&data)) return *a;
    throw GgufError({},
                    fmt::format("value of type {} is not an array", gguf_value_type_name(type)));
}

std::string GgufValue::to_display(size_t max_items) const {
    switch (type) {
        case GgufValueType::BOOL:
            return std::get<bool>(data) ? "true" : "false";
        case GgufValueType::FLOAT32:  // shortest form that reads back as the same float
            return fmt::format("{}", static_cast<float>(std::get<double>(data)));
        case GgufValueType::FLOAT64:
            return fmt::format("{}", std::get<double>(data));
        case GgufValueType::STRING:
            return quote(std::get<std::string>(data), 80);
        case GgufValueType::ARRAY: {
            const auto& items = std::get<std::vector<GgufValue>>(data);
            std::string out = "[";
            for (size_t i = 0; i < items.size() && i < max_items; ++i) {
                if (i) out += ", ";
                out += items[i].to_display(max_items);
            }
            if (items.size() > max_items)
                out += fmt::format("{}... ({} items)", items.empty() ? "" : ", ", items.size());
            out += "]";
            return out;
        }
        default:
            if (auto* u = std::get_if<uint64_t>(&data)) return fmt::format("{}", *u);
            if (auto* i = std::get_if<int64_t>(&data)) return fmt::format("{}", *i);
            return "?";
    }
}

// ---- GgufFile: opening and lifetime ---------------------------------------------------

GgufFile GgufFile::open(const std::string& path, GgufOpenOptions options) {
    GgufFile f = open_one(path, options);
    f.open_shards(options);
    return f;
}

void GgufFile::open_shards(GgufOpenOptions options) {
    const GgufValue* count_v = find("split.count");
    if (!count_v) return;
    const int64_t count = get_int("split.count");
    const int64_t no = get_int_or("split.no", 0);
    if (count < 1 || count > 9999)
        fail_key("split.count", fmt::format("bad split count {}", count));
    if (count == 1) return;
    // PREFIX-00001-of-0000N.gguf names the first file; the others differ in the first number.
    const std::string tail = fmt::format("-{:05d}-of-{:05d}.gguf", no + 1, count);
    if (no != 0)
        throw Error(
            fmt::format("{}: this is file {} of a model split into {}", path_, no + 1, count),
            "open its first file, the one named ...-00001-of-" + fmt::format("{:05d}", count) +
                ".gguf");
    if (path_.size() <= tail.size() || path_.compare(path_.size() - tail.size(), tail.size(), tail))
        throw Error(fmt::format("{}: the first file of a model split into {} must be named "
                                "PREFIX{} to find the others",
                                path_, count, tail),
                    "keep the names gguf-split gave the files");
    const std::string prefix = path_.substr(0, path_.size() - tail.size());
    for (int64_t i = 1; i < count; ++i) {
        const std::string shard_path = prefix + fmt::format("-{:05d}-of-{:05d}.gguf", i + 1, count);
        auto shard = std::make_unique<GgufFile>(open_one(shard_path, options));
        if (shard->get_int_or("split.no", -1) != i || shard->get_int_or("split.count", -1) != count)
            throw GgufError(
                shard_path,
                fmt::format("not file {} of {} (its split.no / split.count differ)", i + 1, count),
                "header");
        for (size_t t = 0; t < shard->tensors_.size(); ++t) {
            const GgufTensorInfo& ti = shard->tensors_[t];
            if (tensor_index_.count(ti.name))
                throw GgufError(shard_path, "tensor also in an earlier file of the split model",
                                "tensor '" + ti.name + "'", shard->tensor_info_offsets_[t]);
            tensor_index_.emplace(ti.name, tensors_.size());
            tensors_.push_back(ti);
            tensors_.back().split = int32_t(i);
            tensor_info_offsets_.push_back(shard->tensor_info_offsets_[t]);
        }
        if (!shard->lock_error_.empty() && lock_error_.empty()) lock_error_ = shard->lock_error_;
        shards_.push_back(std::move(shard));
    }
    const int64_t expected = get_int_or("split.tensors.count", int64_t(tensors_.size()));
    if (expected != int64_t(tensors_.size()))
        fail_key("split.tensors.count", fmt::format("the {} files hold {} tensors, not {}", count,
                                                    tensors_.size(), expected));
}

GgufFile GgufFile::open_one(const std::string& path, GgufOpenOptions options) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        fail("{}: cannot stat: {}", path, std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail("{}: not a regular file", path);
    }
    GgufFile f;
    f.path_ = path;
    f.size_ = static_cast<uint64_t>(st.st_size);
    if (f.size_ > 0 && options.mmap) {
        void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
        int err = errno;
        ::close(fd);
        if (m == MAP_FAILED) fail("{}: cannot map the file: {}", path, std::strerror(err));
        f.map_ = m;
        f.base_ = static_cast<const uint8_t*>(m);
    } else if (f.size_ > 0) {
        // Page-aligned like a mapping, so tensor data keeps the file's alignment.
        f.read_ = std::aligned_alloc(4096, (f.size_ + 4095) / 4096 * 4096);
        if (!f.read_) {
            ::close(fd);
            fail("{}: cannot allocate {:.1f} MiB to read the file (--no-mmap)", path,
                 double(f.size_) / (1 << 20));
        }
        uint64_t done = 0;
        while (done < f.size_) {
            const ssize_t n = ::pread(fd, static_cast<uint8_t*>(f.read_) + done,
                                      std::min<uint64_t>(f.size_ - done, 1u << 30), off_t(done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                const int err = n < 0 ? errno : 0;
                ::close(fd);
                fail("{}: cannot read the file: {}", path,
                     err ? std::strerror(err) : "it ended early");
            }
            done += uint64_t(n);
        }
        ::close(fd);
        f.base_ = static_cast<const uint8_t*>(f.read_);
    } else {
        ::close(fd);
    }
    if (options.mlock && f.size_ > 0) {
        if (::mlock(f.base_, f.size_) == 0)
            f.locked_ = true;
        else
            f.lock_error_ = std::strerror(errno);
    }
    f.parse();  // on a throw, f's destructor unmaps
    return f;
}

GgufFile GgufFile::from_memory(const void* bytes, size_t size, std::string name) {
    GgufFile f;
    f.path_ = std::move(name);
    f.owned_.assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + size);
    f.base_ = f.owned_.data();
    f.size_ = size;
    f.parse();
    return f;
}

GgufFile::GgufFile(GgufFile&& other) noexcept {
    *this = std::move(other);
}

GgufFile& GgufFile::operator=(GgufFile&& other) noexcept {
    if (this == &other) return *this;
    // Swap everything: `other` releases our old mapping when it is destroyed. Moving
    // owned_ keeps its buffer, so base_ and tensor data pointers stay valid.
    std::swap(path_, other.path_);
    std::swap(version_, other.version_);
    std::swap(alignment_, other.alignment_);
    std::swap(data_offset_, other.data_offset_);
    std::swap(base_, other.base_);
    std::swap(size_, other.size_);
    std::swap(map_, other.map_);
    std::swap(owned_, other.owned_);
    std::swap(read_, other.read_);
    std::swap(locked_, other.locked_);
    std::swap(lock_error_, other.lock_error_);
    std::swap(kv_, other.kv_);
    std::swap(kv_offsets_, other.kv_offsets_);
    std::swap(kv_index_, other.kv_index_);
    std::swap(tensors_, other.tensors_);
    std::swap(tensor_info_offsets_, other.tensor_info_offsets_);
    std::swap(tensor_index_, other.tensor_index_);
    std::swap(shards_, other.shards_);
    return *this;
}

GgufFile::~GgufFile() {
    if (map_) ::munmap(map_, size_);  // also unlocks
    if (read_) {
        if (locked_) ::munlock(read_, size_);
        std::free(read_);
    }
}

// ---- GgufFile: parsing ------------------------------------------------------------------

namespace {

// Block layout of a tensor type, or nullptr when the id is unknown.
const GgmlTypeTraits* known_traits(uint32_t id) {
    if (!ggml_type_known(id)) return nullptr;
    return &ggml_type_traits(static_cast<GgmlType>(id));
}

}  // namespace

void GgufFile::parse() {
    Cursor c(base_, size_, path_);
    c.set_context("header");
    if (size_ < 4)
        c.fail_at(0, fmt::format("not a GGUF file (bad magic: the file is only {} bytes)", size_));
    if (c.read<uint32_t>("magic") != kGgufMagic)
        c.fail_at(0, fmt::format("not a GGUF file (bad magic {}, expected \"GGUF\")",
                                 quote({reinterpret_cast<const char*>(base_), 4}, 4)));

    uint64_t at = c.pos();
    version_ = c.read<uint32_t>("version");
    if (version_ == 1) c.fail_at(at, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (version_ != 2 && version_ != 3) {
        bool swapped = version_ == 0x02000000 || version_ == 0x03000000;
        c.fail_at(at, fmt::format("unsupported GGUF version {}{} (only versions 2 and 3)", version_,
                                  swapped ? " (a big-endian file?)" : ""));
    }
    at = c.pos();
    uint64_t n_tensors = c.read<uint64_t>("tensor count");
    uint64_t n_kv = c.read<uint64_t>("metadata count");
    // A tensor info takes >= 32 bytes, a key/value >= 13: reject counts the file can't hold.
    if (n_tensors > c.remaining() / 32)
        c.fail_at(at, fmt::format("tensor count {} is impossible: only {} bytes follow the header "
                                  "(truncated or corrupt file)",
                                  n_tensors, c.remaining()));
    if (n_kv > c.remaining() / 13)
        c.fail_at(at + 8, fmt::format("metadata count {} is impossible: only {} bytes follow the "
                                      "header (truncated or corrupt file)",
                                      n_kv, c.remaining()));
    if (n_tensors * 32 + n_kv * 13 > c.remaining())  // no overflow: each term <= remaining
        c.fail_at(at, fmt::format("{} tensors and {} metadata entries cannot fit in the {} bytes "
                                  "after the header (truncated or corrupt file)",
                                  n_tensors, n_kv, c.remaining()));

    // Metadata.
    ValueParser values(c);
    uint64_t alignment_at = 0;  // where the general.alignment entry starts (for errors)
    kv_.reserve(static_cast<size_t>(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        c.set_context(fmt::format("metadata entry {}", i));
        uint64_t key_at = c.pos();
        std::string key = c.read_string("key");
        c.set_context(key_where(key));
        if (kv_index_.count(key)) c.fail_at(key_at, "duplicate metadata key");
        GgufValueType t = values.read_type("value type");
        GgufValue v = values.read_value(t, 0);
        if (key == "general.alignment") alignment_at = key_at;
        kv_index_.emplace(key, kv_.size());
        kv_.emplace_back(std::move(key), std::move(v));
        kv_offsets_.push_back(key_at);
    }

    // Alignment.
    if (const GgufValue* a = find("general.alignment")) {
        c.set_context("key 'general.alignment'");
        if (!a->is_int() || a->type == GgufValueType::INT64 || a->type == GgufValueType::UINT64 ||
            a->as_int() <= 0 || static_cast<uint64_t>(a->as_int()) > kMaxAlignment ||
            !std::has_single_bit(static_cast<uint64_t>(a->as_int())))
            c.fail_at(alignment_at,
                      fmt::format("alignment must be a power of two between 1 and {}, got {} "
                                  "({})",
                                  kMaxAlignment, a->to_display(), gguf_value_type_name(a->type)));
        alignment_ = static_cast<uint64_t>(a->as_int());
    }

    // Tensor infos.
    tensors_.reserve(static_cast<size_t>(n_tensors));
    tensor_info_offsets_.reserve(static_cast<size_t>(n_tensors));
    std::vector<uint64_t> offset_field_at;  // [n_tensors] where each data offset field starts
    offset_field_at.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        c.set_context(fmt::format("tensor #{}", i));
        uint64_t info_at = c.pos();
        GgufTensorInfo ti;
        ti.name = c.read_string("tensor name");
        c.set_context(tensor_where(ti.name));
        if (tensor_index_.count(ti.name)) c.fail_at(info_at, "duplicate tensor name");

        at = c.pos();
        uint32_t n_dims = c.read<uint32_t>("dimension count");
        if (n_dims < 1 || n_dims > 4)
            c.fail_at(at, fmt::format("dimension count {} is not in 1..4", n_dims));
        int64_t n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            at = c.pos();
            uint64_t dim = c.read<uint64_t>("dimension");
            if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                c.fail_at(at, fmt::format("dimension {} is {} (must be >= 1)", d, dim));
            if (__builtin_mul_overflow(n_elements, static_cast<int64_t>(dim), &n_elements))
                c.fail_at(at, "element count overflows 64 bits");
            ti.dims.push_back(static_cast<int64_t>(dim));
        }
        ti.n_elements = n_elements;

        at = c.pos();
        uint32_t type_id = c.read<uint32_t>("tensor type");
        const GgmlTypeTraits* traits = known_traits(type_id);
        if (!traits) c.fail_at(at, fmt::format("unknown tensor type {}", type_id));
        ti.type = static_cast<GgmlType>(type_id);
        if (ti.dims[0] % traits->block_elems != 0)
            c.fail_at(at, fmt::format("row length {} is not a multiple of {}'s block size {}",
                                      ti.dims[0], traits->name, traits->block_elems));
        uint64_t n_blocks = static_cast<uint64_t>(n_elements / traits->block_elems);
        if (__builtin_mul_overflow(n_blocks, static_cast<uint64_t>(traits->block_bytes),
                                   &ti.n_bytes))
            c.fail_at(at, "tensor byte size overflows 64 bits");

        at = c.pos();
        ti.offset = c.read<uint64_t>("tensor data offset");
        if (ti.offset % alignment_ != 0)
            c.fail_at(at, fmt::format("data offset {} is not a multiple of the alignment {}",
                                      ti.offset, alignment_));
        tensor_index_.emplace(ti.name, tensors_.size());
        tensors_.push_back(std::move(ti));
        tensor_info_offsets_.push_back(info_at);
        offset_field_at.push_back(at);
    }

    // Data section: starts at the next multiple of the alignment. A file without tensors
    // may end before it (vocab-only files do).
    uint64_t pos = c.pos();
    uint64_t pad = (alignment_ - pos % alignment_) % alignment_;
    data_offset_ = pos + pad;
    if (n_tensors == 0) return;
    c.set_context("header");
    if (data_offset_ > size_)
        c.fail_at(pos, fmt::format("file truncated: the data section would start at byte {} but "
                                   "the file has {} bytes",
                                   data_offset_, size_));
    uint64_t data_size = size_ - data_offset_;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        GgufTensorInfo& ti = tensors_[i];
        if (ti.offset > data_size || ti.n_bytes > data_size - ti.offset) {
            c.set_context(tensor_where(ti.name));
            c.fail_at(offset_field_at[i],
                      fmt::format("data [{}, +{} bytes) lies outside the file's data section "
                                  "({} bytes from byte {}; file truncated?)",
                                  ti.offset, ti.n_bytes, data_size, data_offset_));
        }
        ti.data = base_ + data_offset_ + ti.offset;
    }

    // No two tensors may share bytes (llama.cpp rejects such files too). Sorted by start,
    // any overlap shows up between neighbours: a tensor overlapping a later one also
    // overlaps the one that starts right after it.
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
        const GgufTensorInfo& prev = tensors_[order[k - 1]];
        const GgufTensorInfo& cur = tensors_[order[k]];
        if (cur.offset - prev.offset >= prev.n_bytes) continue;  // prev ends at or before cur
        // Report at the tensor listed later in the file, naming the one it collides with.
        size_t later = std::max(order[k - 1], order[k]);
        const GgufTensorInfo& other = &tensors_[later] == &cur ? prev : cur;
        const GgufTensorInfo& self = tensors_[later];
        c.set_context(tensor_where(self.name));
        c.fail_at(offset_field_at[later],
                  fmt::format("data [{}, +{} bytes) overlaps tensor '{}' at [{}, +{} bytes) "
                              "(offsets relative to the data section at byte {})",
                              self.offset, self.n_bytes, escaped(other.name, 96), other.offset,
                              other.n_bytes, data_offset_));
    }
}

// ---- GgufFile: lookups ----------------------------------------------------------------------

void GgufFile::override_value(const std::string& key, GgufValue value) {
    if (auto it = kv_index_.find(key); it != kv_index_.end()) {
        kv_[it->second].second = std::move(value);
        return;
    }
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(key, std::move(value));
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::fail_key(std::string_view key, std::string problem) const {
    std::optional<uint64_t> at;
    if (auto it = kv_index_.find(key); it != kv_index_.end() && it->second < kv_offsets_.size())
        at = kv_offsets_[it->second];
    throw GgufError(path_, std::move(problem), key_where(key), at);
}

void GgufFile::fail_tensor(std::string_view name, std::string problem) const {
    std::optional<uint64_t> at;
    if (auto it = tensor_index_.find(name);
        it != tensor_index_.end() && it->second < tensor_info_offsets_.size())
        at = tensor_info_offsets_[it->second];
    throw GgufError(path_, std::move(problem), tensor_where(name), at);
}

namespace {

const GgufValue& require(const GgufFile& f, std::string_view key) {
    const GgufValue* v = f.find(key);
    if (!v) f.fail_key(key, "required metadata key is missing");
    return *v;
}

[[noreturn]] void wrong_type(const GgufFile& f, std::string_view key, const GgufValue& v,
                             const char* expected) {
    f.fail_key(key, "metadata value " + type_mismatch(v, expected));
}

int64_t int_of(const GgufFile& f, std::string_view key, const GgufValue& v) {
    if (!v.is_int()) wrong_type(f, key, v, "an integer");
    if (auto* u = std::get_if<uint64_t>(&v.data);
        u && *u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        f.fail_key(key, fmt::format("metadata value {} does not fit in int64", *u));
    return v.as_int();
}

double float_of(const GgufFile& f, std::string_view key, const GgufValue& v) {
    if (!v.is_float() && !v.is_int()) wrong_type(f, key, v, "a number");
    return v.as_float();
}

bool bool_of(const GgufFile& f, std::string_view key, const GgufValue& v) {
    if (v.type != GgufValueType::BOOL) wrong_type(f, key, v, "bool");
    return v.as_bool();
}

const std::string& string_of(const GgufFile& f, std::string_view key, const GgufValue& v) {
    if (v.type != GgufValueType::STRING) wrong_type(f, key, v, "string");
    return v.as_string();
}

}  // namespace

int64_t GgufFile::get_int(std::string_view key) const {
    return int_of(*this, key, require(*this, key));
}
double GgufFile::get_float(std::string_view key) const {
    return float_of(*this, key, require(*this, key));
}
bool GgufFile::get_bool(std::string_view key) const {
    return bool_of(*this, key, require(*this, key));
}
const std::string& GgufFile::get_string(std::string_view key) const {
    return string_of(*this, key, require(*this, key));
}
const std::vector<GgufValue>& GgufFile::get_array(std::string_view key) const {
    const GgufValue& v = require(*this, key);
    if (v.type != GgufValueType::ARRAY) wrong_type(*this, key, v, "array");
    return v.as_array();
}

int64_t GgufFile::get_int_or(std::string_view key, int64_t def) const {
    const GgufValue* v = find(key);
    return v ? int_of(*this, key, *v) : def;
}
double GgufFile::get_float_or(std::string_view key, double def) const {
    const GgufValue* v = find(key);
    return v ? float_of(*this, key, *v) : def;
}
bool GgufFile::get_bool_or(std::string_view key, bool def) const {
    const GgufValue* v = find(key);
    return v ? bool_of(*this, key, *v) : def;
}
std::string GgufFile::get_string_or(std::string_view key, std::string def) const {
    const GgufValue* v = find(key);
    return v ? string_of(*this, key, *v) : def;
}

}  // namespace kvrun
