// Prompt cache files: see prompt_cache.h for the layout and the rules.
#include "prompt_cache.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_set>

#include "common.h"
#include "kv_format.h"
#include "stdio_file.h"

namespace kvrun {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'R', 'U', 'N', 'P', 'C', '1'};
constexpr uint32_t kVersion = 2;

// FNV-1a, 64 bits, over everything fed to it.
struct Fnv {
    uint64_t h = 0xcbf29ce484222325ull;
    void bytes(const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    }
    template <typename T>
    void value(const T& v) {
        bytes(&v, sizeof v);
    }
    void text(const std::string& s) {
        value(uint64_t(s.size()));
        bytes(s.data(), s.size());
    }
};

// Reads exactly n bytes (hashing them), or throws the truncation error.
void read_exact(FILE* f, void* dst, size_t n, Fnv& sum, const std::string& path) {
    if (n && std::fread(dst, 1, n, f) != n)
        throw Error(fmt::format("{}: prompt cache is truncated", path),
                    "delete it; the next run writes a new one");
    sum.bytes(dst, n);
}

template <typename T>
T read_value(FILE* f, Fnv& sum, const std::string& path) {
    T v{};
    read_exact(f, &v, sizeof v, sum, path);
    return v;
}

// Writes n bytes (hashing them); throws on an I/O error.
void write_exact(FILE* f, const void* src, size_t n, Fnv& sum, const std::string& path) {
    if (n && std::fwrite(src, 1, n, f) != n)
        throw Error(fmt::format("{}: cannot write the prompt cache", path),
                    "check the disk space and permissions");
    sum.bytes(src, n);
}

template <typename T>
void write_value(FILE* f, const T& v, Fnv& sum, const std::string& path) {
    write_exact(f, &v, sizeof v, sum, path);
}

}  // namespace

uint64_t prompt_cache_model_hash(const GgufFile& file, const ModelConfig& c) {
    Fnv h;
    h.value(uint64_t(file.file_size()));
    h.value(uint64_t(file.tensors().size()));
    for (const GgufTensorInfo& t : file.tensors()) {
        h.text(t.name);
        h.value(uint32_t(t.type));
        for (int64_t d : t.dims) h.value(d);
        h.value(t.offset);
        h.bytes(t.data, size_t(std::min<uint64_t>(t.n_bytes, 4096)));
    }
    h.text(c.arch);
    for (int64_t v : {c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_kv_head, c.head_dim, c.n_rot,
                      c.n_vocab, c.yarn_n_ctx_orig, c.n_ctx_train})
        h.value(v);
    for (float v : {c.norm_eps, c.rope_freq_base, c.rope_freq_scale, c.yarn_ext_factor,
                    c.yarn_attn_factor, c.yarn_beta_fast, c.yarn_beta_slow})
        h.value(v);
    h.value(c.rope_neox);
    h.text(c.rope_scaling);
    h.bytes(c.rope_freq_factors.data(), c.rope_freq_factors.size() * sizeof(float));
    return h.h;
}

PromptCacheKey prompt_cache_key(const GgufFile& file, const Backend& backend, KvType k, KvType v,
                                bool rotate, const std::vector<LoraSpec>& lora,
                                const ControlVectorOptions& cvec) {
    PromptCacheKey key;
    key.model_hash = prompt_cache_model_hash(file, backend.config());
    for (const LoraSpec& spec : lora) {
        Fnv h;
        h.value(key.model_hash);
        h.value(prompt_cache_model_hash(GgufFile::open(spec.path), backend.config()));
        h.value(spec.scale);
        key.model_hash = h.h;
    }
    if (!cvec.empty()) {  // the steered K/V differ: the summed directions join the hash
        const ControlVector cv = control_vector_load(cvec, backend.config());
        Fnv h;
        h.value(key.model_hash);
        h.bytes(cv.values.data(), cv.values.size() * sizeof(float));
        key.model_hash = h.h;
    }
    key.kv_format =
        fmt::format("k={} v={} rotate={}", kv_type_name(k), kv_type_name(v), rotate ? "on" : "off");
    const ModelConfig& c = backend.config();
    bool has_swa = false;
    for (int64_t l = 0; l < c.n_layer; ++l) has_swa = has_swa || c.is_swa(l);
    if (has_swa)
        key.kv_format += backend.kv_window_pool().n_blocks > 0 ? " swa=split" : " swa=full";
    key.block_size = backend.kv_block_size();
    key.block_bytes = backend.kv_block_io_bytes(KvPool::Main);
    key.window_block_bytes = backend.kv_block_io_bytes(KvPool::Window);
    return key;
}

PromptCacheLoad prompt_cache_load(const std::string& path, const PromptCacheKey& key,
                                  KvBlockTable& table, Backend& backend, int64_t n_vocab) {
    PromptCacheLoad r;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return r;
    r.found = true;
    FilePtr f(std::fopen(path.c_str(), "rb"));
    if (!f) throw Error(fmt::format("{}: cannot open the prompt cache", path));
    const uint64_t size = std::filesystem::file_size(path, ec);
    Fnv sum;
    char magic[8];
    if (ec || size < sizeof magic || std::fread(magic, 1, sizeof magic, f.get()) != sizeof magic ||
        std::memcmp(magic, kMagic, sizeof magic) != 0)
        throw Error(fmt::format("{}: not a kvrun prompt cache", path),
                    "pass a new file name to --prompt-cache, or delete this one");
    sum.bytes(magic, sizeof magic);
    const auto version = read_value<uint32_t>(f.get(), sum, path);
    if (version != kVersion) {
        r.ignored =
            fmt::format("it has format version {} (this kvrun writes {})", version, kVersion);
        return r;
    }
    PromptCacheKey got;
    got.model_hash = read_value<uint64_t>(f.get(), sum, path);
    got.block_size = read_value<int32_t>(f.get(), sum, path);
    got.block_bytes = read_value<int64_t>(f.get(), sum, path);
    got.window_block_bytes = read_value<int64_t>(f.get(), sum, path);
    const auto fmt_len = read_value<uint32_t>(f.get(), sum, path);
    if (fmt_len > 256) throw Error(fmt::format("{}: prompt cache header is corrupt", path));
    got.kv_format.resize(fmt_len);
    read_exact(f.get(), got.kv_format.data(), fmt_len, sum, path);
    if (got.model_hash != key.model_hash) {
        r.ignored =
            "it was made with another model (or other --rope-*, --lora or --control-vector "
            "settings)";
    } else if (got.kv_format != key.kv_format || got.block_size != key.block_size ||
               got.block_bytes != key.block_bytes ||
               got.window_block_bytes != key.window_block_bytes) {
        r.ignored = fmt::format(
            "it was made with another KV cache ({}, blocks of {} tokens; now "
            "{}, blocks of {})",
            got.kv_format, got.block_size, key.kv_format, key.block_size);
    }
    if (!r.ignored.empty()) return r;
    const auto n_blocks = read_value<uint32_t>(f.get(), sum, path);
    const uint64_t header = 8 + 4 + 8 + 4 + 8 + 8 + 4 + fmt_len + 4;
    const uint64_t per_block = 8 + 4 * uint64_t(key.block_size) + uint64_t(key.block_bytes) + 1;
    const auto corrupt = [&] {
        return Error(fmt::format("{}: prompt cache is truncated or corrupt ({} bytes for {} "
                                 "blocks)",
                                 path, size, n_blocks),
                     "delete it; the next run writes a new one");
    };
    if (size < header + uint64_t(n_blocks) * per_block + 8) throw corrupt();
    r.blocks_in_file = n_blocks;

    // Pass 1 checks tokens and the checksum before anything touches the table, so a corrupt
    // file changes nothing; pass 2 reads the blocks again into free pool blocks.
    const long blocks_start = std::ftell(f.get());
    std::vector<TokenId> tokens(size_t(key.block_size));
    std::vector<uint8_t> bytes(size_t(key.block_bytes));
    std::vector<uint8_t> wbytes(size_t(key.window_block_bytes));
    std::vector<bool> in_chain(n_blocks, false);
    uint64_t chain_end = 0;
    for (uint32_t i = 0; i < n_blocks; ++i) {
        const auto parent = read_value<uint64_t>(f.get(), sum, path);
        read_exact(f.get(), tokens.data(), tokens.size() * sizeof(TokenId), sum, path);
        if (i == 0 || parent == chain_end) {
            in_chain[i] = true;
            r.chain.insert(r.chain.end(), tokens.begin(), tokens.end());
            chain_end = KvBlockTable::hash_block(parent, tokens);
        }
        for (TokenId t : tokens)
            if (t < 0 || t >= n_vocab)
                throw Error(fmt::format("{}: prompt cache holds token id {} outside the "
                                        "vocabulary ({} tokens)",
                                        path, t, n_vocab),
                            "delete it; the next run writes a new one");
        read_exact(f.get(), bytes.data(), bytes.size(), sum, path);
        const auto has_window = read_value<uint8_t>(f.get(), sum, path);
        if (has_window > 1 || (has_window && wbytes.empty())) throw corrupt();
        if (has_window) read_exact(f.get(), wbytes.data(), wbytes.size(), sum, path);
    }
    const uint64_t want = sum.h;
    Fnv ignore;
    if (read_value<uint64_t>(f.get(), ignore, path) != want)
        throw Error(fmt::format("{}: prompt cache is corrupt (checksum mismatch)", path),
                    "delete it; the next run writes a new one");
    if (std::ftell(f.get()) != long(size)) throw corrupt();  // bytes after the checksum
    if (blocks_start < 0 || std::fseek(f.get(), blocks_start, SEEK_SET) != 0)
        throw Error(fmt::format("{}: cannot read the prompt cache", path));
    for (uint32_t i = 0; i < n_blocks && table.n_free_blocks() > 0; ++i) {
        // Parents come first, so what fits is a usable prefix of each chain.
        const auto parent = read_value<uint64_t>(f.get(), ignore, path);
        read_exact(f.get(), tokens.data(), tokens.size() * sizeof(TokenId), ignore, path);
        read_exact(f.get(), bytes.data(), bytes.size(), ignore, path);
        const bool has_window = read_value<uint8_t>(f.get(), ignore, path) != 0;
        if (has_window) read_exact(f.get(), wbytes.data(), wbytes.size(), ignore, path);
        const BlockId id = table.import_cached_block(parent, tokens, has_window);
        if (in_chain[i]) ++r.chain_blocks_present;  // (the loop reaches blocks in file order)
        if (id < 0) continue;                       // cached already
        backend.write_kv_block(KvPool::Main, id, bytes.data());
        ++r.blocks_loaded;
        if (has_window && table.window_of(id) >= 0) {
            backend.write_kv_block(KvPool::Window, table.window_of(id), wbytes.data());
            ++r.windows_loaded;
        }
    }
    return r;
}

void PromptCacheWindows::keep(const KvBlockTable& table, Backend& backend, SeqId seq) {
    if (!table.windowed()) return;
    const std::vector<BlockId>& blocks = table.block_ids(seq);
    const std::vector<BlockId> partners = table.window_ids(seq);
    const size_t n_full = size_t(table.n_tokens(seq) / table.block_size());
    const size_t n_bytes = size_t(backend.kv_block_io_bytes(KvPool::Window));
    for (size_t i = 0; i < n_full; ++i) {
        const uint64_t h = table.cached_hash(blocks[i]);
        if (partners[i] < 0 || h == 0 || parts_.count(h) != 0) continue;
        std::vector<uint8_t> bytes(n_bytes);
        backend.read_kv_block(KvPool::Window, partners[i], bytes.data());
        parts_.emplace(h, std::move(bytes));
        order_.push_back(h);
        bytes_ += int64_t(n_bytes);
    }
    while (bytes_ > max_bytes_ && !order_.empty()) {
        auto it = parts_.find(order_.front());
        bytes_ -= int64_t(it->second.size());
        parts_.erase(it);
        order_.pop_front();
    }
}

const std::vector<uint8_t>* PromptCacheWindows::find(uint64_t hash) const {
    auto it = parts_.find(hash);
    return it == parts_.end() ? nullptr : &it->second;
}

int64_t prompt_cache_save(const std::string& path, const PromptCacheKey& key,
                          const KvBlockTable& table, Backend& backend,
                          const std::vector<std::vector<TokenId>>& sequences,
                          const PromptCacheWindows* kept) {
    // Each cached block once, in chain order (a parent before its children).
    struct Out {
        BlockId block;
        const TokenId* tokens;
    };
    std::vector<Out> out;
    std::unordered_set<BlockId> seen;
    const size_t bs = size_t(key.block_size);
    for (const auto& seq : sequences) {
        const std::vector<BlockId> blocks = table.cached_prefix_blocks(seq);
        for (size_t i = 0; i < blocks.size(); ++i)
            if (seen.insert(blocks[i]).second) out.push_back({blocks[i], seq.data() + i * bs});
    }

    const std::string tmp = path + ".tmp";
    std::error_code ec;
    try {
        FilePtr f(std::fopen(tmp.c_str(), "wb"));
        if (!f)
            throw Error(fmt::format("{}: cannot write the prompt cache", path),
                        "check that the directory exists and is writable");
        Fnv sum;
        write_exact(f.get(), kMagic, sizeof kMagic, sum, path);
        write_value(f.get(), kVersion, sum, path);
        write_value(f.get(), key.model_hash, sum, path);
        write_value(f.get(), key.block_size, sum, path);
        write_value(f.get(), key.block_bytes, sum, path);
        write_value(f.get(), key.window_block_bytes, sum, path);
        write_value(f.get(), uint32_t(key.kv_format.size()), sum, path);
        write_exact(f.get(), key.kv_format.data(), key.kv_format.size(), sum, path);
        write_value(f.get(), uint32_t(out.size()), sum, path);
        std::vector<uint8_t> bytes(size_t(key.block_bytes));
        std::vector<uint8_t> wbytes(size_t(key.window_block_bytes));
        for (const Out& o : out) {
            write_value(f.get(), table.cached_parent_hash(o.block), sum, path);
            write_exact(f.get(), o.tokens, bs * sizeof(TokenId), sum, path);
            backend.read_kv_block(KvPool::Main, o.block, bytes.data());
            write_exact(f.get(), bytes.data(), bytes.size(), sum, path);
            // The windowed layers: from the live partner, else as kept, else none.
            const uint8_t* w = nullptr;
            if (!wbytes.empty() && table.window_of(o.block) >= 0) {
                backend.read_kv_block(KvPool::Window, table.window_of(o.block), wbytes.data());
                w = wbytes.data();
            } else if (const auto* k = kept ? kept->find(table.cached_hash(o.block)) : nullptr;
                       k && k->size() == wbytes.size() && !wbytes.empty()) {
                w = k->data();
            }
            write_value(f.get(), uint8_t(w ? 1 : 0), sum, path);
            if (w) write_exact(f.get(), w, wbytes.size(), sum, path);
        }
        Fnv ignore;
        write_value(f.get(), sum.h, ignore, path);
        if (std::fflush(f.get()) != 0 || std::fclose(f.release()) != 0)
            throw Error(fmt::format("{}: cannot write the prompt cache", path),
                        "check the disk space and permissions");
    } catch (...) {
        std::filesystem::remove(tmp, ec);
        throw;
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        throw Error(fmt::format("{}: cannot replace the prompt cache", path));
    }
    return int64_t(out.size());
}

}  // namespace kvrun
