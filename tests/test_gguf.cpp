// Tests for the GGUF reader and writer: round trips of every value type, more than twenty
// kinds of corrupt file (each must throw GgufError naming the problem), every truncation of
// a small file, and every real model and vocabulary file under ../shared.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gguf.h"
#include "gguf_writer.h"
#include "quant.h"
#include "test_util.h"

using namespace kvrun;
namespace fs = std::filesystem;

namespace {

// Hand-built GGUF bytes, for files the writer refuses to make.
struct Bytes {
    std::vector<uint8_t> b;
    template <typename T>
    Bytes& put(T v) {
        size_t at = b.size();
        b.resize(at + sizeof(T));
        std::memcpy(b.data() + at, &v, sizeof(T));
        return *this;
    }
    Bytes& u32(uint32_t v) { return put(v); }
    Bytes& u64(uint64_t v) { return put(v); }
    Bytes& str(std::string_view s) {
        u64(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Bytes& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
    Bytes& pad_to(size_t a) { return zeros((a - b.size() % a) % a); }
    // key + uint32 value
    Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
    // tensor info: name, dims, type, offset
    Bytes& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                  uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(dims.size()));
        for (uint64_t d : dims) u64(d);
        return u32(type).u64(offset);
    }
};

Bytes header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    Bytes h;
    h.u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
    return h;
}

// A valid file with one key and one F32 [4] tensor (16 bytes of data).
Bytes one_tensor_file(uint32_t type = 0, std::vector<uint64_t> dims = {4}, uint64_t offset = 0,
                      size_t data_bytes = 16) {
    Bytes f = header(1, 1);
    f.kv_u32("answer", 42).tensor("w", dims, type, offset).pad_to(32).zeros(data_bytes);
    return f;
}

// The error a file is rejected with; every parse error must name the file, the section,
// key or tensor ("where") and the byte offset, and read "<file>: <problem> (<where>, at byte
// offset <N>)".
std::string parse_error(const std::vector<uint8_t>& bytes) {
    try {
        GgufFile::from_memory(bytes.data(), bytes.size(), "bad.gguf");
    } catch (const GgufError& e) {
        std::string msg = e.what();
        bool structured = e.file() == "bad.gguf" && !e.problem().empty() && !e.where().empty() &&
                          e.offset().has_value() &&
                          msg == fmt::format("bad.gguf: {} ({}, at byte offset {})", e.problem(),
                                             e.where(), *e.offset());
        if (!structured) return "<unstructured error> " + msg;
        return msg;
    }
    return "<no error>";
}

// The file must be rejected with a GgufError whose message holds every fragment.
void expect_error(const Bytes& f, std::initializer_list<std::string_view> fragments) {
    std::string msg = parse_error(f.b);
    INFO("message: " << msg);
    CHECK(msg.rfind("bad.gguf: ", 0) == 0);
    for (std::string_view frag : fragments) CHECK(msg.find(frag) != std::string::npos);
}

// The GgufError a file is rejected with (REQUIREs that there is one).
GgufError parse_exception(const Bytes& f) {
    try {
        GgufFile::from_memory(f.b.data(), f.b.size(), "bad.gguf");
    } catch (const GgufError& e) {
        return e;
    }
    FAIL("the file was accepted");
    return GgufError("", "");
}

std::vector<uint8_t> bytes_of(const void* p, size_t n) {
    const auto* u = static_cast<const uint8_t*>(p);
    return {u, u + n};
}

}  // namespace

TEST_CASE("writer round trip: every value type, nested arrays, tensors") {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u8("t.u8", 250);
    w.set_i8("t.i8", -128);
    w.set_u16("t.u16", 65535);
    w.set_i16("t.i16", -32768);
    w.set_u32("t.u32", 4000000000u);
    w.set_i32("t.i32", -2000000000);
    w.set_u64("t.u64", std::numeric_limits<uint64_t>::max());
    w.set_i64("t.i64", std::numeric_limits<int64_t>::min());
    w.set_f32("t.f32", 0.1f);
    w.set_f64("t.f64", 1e300);
    w.set_bool("t.bool", true);
    w.set_string("t.empty", "");
    w.set_array_str("t.strs", {"a", "", "héllo\n"});
    w.set_array_f32("t.f32s", {1.5f, -2.f});
    w.set_array_i32("t.i32s", {-1, 2, 3});
    w.set_array_u32("t.u32s", {7});
    w.set_array_i64("t.i64s", {-5});
    w.set_array_u8("t.u8s", {});
    w.set_array_bool("t.bools", {true, false});
    w.set_value("t.nested",
                gguf_make_array(GgufValueType::ARRAY,
                                {gguf_make_array(GgufValueType::INT16,
                                                 {gguf_make_int(GgufValueType::INT16, -3)}),
                                 gguf_make_array(GgufValueType::ARRAY, {})}));
    w.set_u32("t.u32", 5);  // replaces, keeps position

    std::vector<float> a(12);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) - 3.5f;
    std::vector<uint8_t> q4(2 * 18, 0x5a), q4k(144, 0x33);
    w.add_tensor("a", GgmlType::F32, {3, 4}, a.data(), a.size() * 4);
    w.add_tensor("q", GgmlType::Q4_0, {32, 2}, q4.data(), q4.size());
    w.add_tensor("k", GgmlType::Q4_K, {256}, q4k.data(), q4k.size());
    CHECK_THROWS_AS(w.add_tensor("a", GgmlType::F32, {1}, a.data(), 4), Error);
    CHECK_THROWS_AS(w.add_tensor("z", GgmlType::F32, {2}, a.data(), 4), Error);  // wrong size
    CHECK_THROWS_AS(w.add_tensor("z", GgmlType::Q8_0, {16}, a.data(), 17), Error);

    std::vector<uint8_t> bytes = w.to_bytes();
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size());
    CHECK(f.version() == 3);
    CHECK(f.alignment() == 32);
    CHECK(f.data_offset() % 32 == 0);
    REQUIRE(f.metadata().size() == 21);
    CHECK(f.metadata()[5].first == "t.u32");
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("t.u8") == 250);
    CHECK(f.find("t.u8")->type == GgufValueType::UINT8);
    CHECK(f.get_int("t.i8") == -128);
    CHECK(f.get_int("t.u16") == 65535);
    CHECK(f.get_int("t.i16") == -32768);
    CHECK(f.get_int("t.u32") == 5);
    CHECK(f.get_int("t.i32") == -2000000000);
    CHECK(std::get<uint64_t>(f.find("t.u64")->data) == std::numeric_limits<uint64_t>::max());
    CHECK_THROWS_AS(f.get_int("t.u64"), GgufError);  // does not fit in int64
    CHECK(f.get_int("t.i64") == std::numeric_limits<int64_t>::min());
    CHECK(f.get_float("t.f32") == static_cast<double>(0.1f));
    CHECK(f.find("t.f32")->type == GgufValueType::FLOAT32);
    CHECK(f.get_float("t.f64") == 1e300);
    CHECK(f.get_bool("t.bool"));
    CHECK(f.get_string("t.empty").empty());
    const auto& strs = f.get_array("t.strs");
    REQUIRE(strs.size() == 3);
    CHECK(strs[2].as_string() == "héllo\n");
    CHECK(f.find("t.strs")->array_type == GgufValueType::STRING);
    CHECK(f.get_array("t.f32s")[1].as_float() == -2.0);
    CHECK(f.get_array("t.i32s")[0].as_int() == -1);
    CHECK(f.get_array("t.u32s")[0].as_int() == 7);
    CHECK(f.get_array("t.i64s")[0].as_int() == -5);
    CHECK(f.get_array("t.u8s").empty());
    CHECK(f.find("t.u8s")->array_type == GgufValueType::UINT8);
    CHECK(f.get_array("t.bools")[1].as_bool() == false);
    const auto& nested = f.get_array("t.nested");
    REQUIRE(nested.size() == 2);
    CHECK(nested[0].array_type == GgufValueType::INT16);
    CHECK(nested[0].as_array()[0].as_int() == -3);
    CHECK(nested[1].array_type == GgufValueType::ARRAY);
    CHECK(nested[1].as_array().empty());
    CHECK(f.find("t.nested")->to_display() == "[[-3], []]");
    CHECK(f.find("t.strs")->to_display() == "[\"a\", \"\", \"héllo\\n\"]");
    CHECK(f.find("t.f32")->to_display() == "0.1");

    REQUIRE(f.tensors().size() == 3);
    const GgufTensorInfo* ta = f.find_tensor("a");
    REQUIRE(ta);
    CHECK(ta->dims == std::vector<int64_t>{3, 4});
    CHECK(ta->n_elements == 12);
    CHECK(ta->n_bytes == 48);
    CHECK(bytes_of(ta->data, 48) == bytes_of(a.data(), 48));
    const GgufTensorInfo* tq = f.find_tensor("q");
    REQUIRE(tq);
    CHECK(tq->type == GgmlType::Q4_0);
    CHECK(tq->n_bytes == 36);
    CHECK(tq->offset % 32 == 0);
    CHECK(bytes_of(tq->data, 36) == q4);
    CHECK(bytes_of(f.find_tensor("k")->data, 144) == q4k);
    CHECK(f.find_tensor("nope") == nullptr);

    // Version 2 has the same layout.
    bytes[4] = 2;
    CHECK(GgufFile::from_memory(bytes.data(), bytes.size()).version() == 2);
}

TEST_CASE("writer: custom alignment, files on disk, move semantics") {
    GgufWriter w(128);
    std::vector<float> x(5, 2.0f), y(3, -1.0f);
    w.add_tensor("x", GgmlType::F32, {5}, x.data(), 20);
    w.add_tensor("y", GgmlType::F32, {3}, y.data(), 12);
    fs::path path = fs::temp_directory_path() / ("kvrun_test_gguf_" + std::to_string(getpid()));
    w.write_file(path.string());
    {
        GgufFile f = GgufFile::open(path.string());
        CHECK(f.alignment() == 128);
        CHECK(f.get_int("general.alignment") == 128);
        CHECK(f.data_offset() % 128 == 0);
        CHECK(f.find_tensor("y")->offset == 128);
        GgufFile g = std::move(f);  // the mapping moves; pointers stay valid
        CHECK(reinterpret_cast<const float*>(g.find_tensor("y")->data)[2] == -1.0f);
        std::vector<uint8_t> empty = GgufWriter().to_bytes();
        GgufFile h = GgufFile::from_memory(empty.data(), empty.size());
        CHECK(h.tensors().empty());
        h = std::move(g);  // move assignment: h now owns the mapping
        CHECK(h.find_tensor("x")->n_bytes == 20);
        CHECK(reinterpret_cast<const float*>(h.find_tensor("x")->data)[4] == 2.0f);
    }
    // --no-mmap reads the file into a page-aligned buffer: the same bytes, the same
    // alignment; --mlock locks them (or says why not).
    for (bool mmap : {true, false}) {
        CAPTURE(mmap);
        GgufOpenOptions o;
        o.mmap = mmap;
        o.mlock = true;
        GgufFile f = GgufFile::open(path.string(), o);
        CHECK(f.mapped() == mmap);
        CHECK(f.locked() == f.lock_error().empty());
        CHECK(reinterpret_cast<uintptr_t>(f.find_tensor("y")->data) % 128 == 0);
        CHECK(reinterpret_cast<const float*>(f.find_tensor("y")->data)[2] == -1.0f);
        GgufFile g = std::move(f);
        CHECK(reinterpret_cast<const float*>(g.find_tensor("x")->data)[4] == 2.0f);
    }
    fs::remove(path);
    CHECK_THROWS_AS(GgufWriter(48), Error);
}

TEST_CASE("corrupt files: magic and version") {
    Bytes good = one_tensor_file();
    CHECK(good.b.size() == 112);
    CHECK_NOTHROW(GgufFile::from_memory(good.b.data(), good.b.size()));

    Bytes f = good;
    f.b[0] = 'X';
    expect_error(f, {"not a GGUF file (bad magic \"XGUF\", expected \"GGUF\")",
                     "(header, at byte offset 0)"});
    Bytes text;
    for (char c : std::string("hello, this is a text file\n")) text.put(c);
    expect_error(text, {"not a GGUF file (bad magic \"hell\""});
    f.b[0] = 0;
    expect_error(f, {"bad magic \"\\x00GUF\""});
    expect_error(Bytes{{'G', 'G'}}, {"not a GGUF file", "bad magic", "only 2 bytes"});
    expect_error(Bytes{}, {"not a GGUF file", "bad magic", "at byte offset 0"});

    f = good;
    f.b[4] = 1;
    expect_error(f, {"version 1 is not supported", "at byte offset 4"});
    f.b[4] = 4;
    expect_error(f, {"unsupported GGUF version 4"});
    f.b[4] = 0;
    f.b[7] = 3;
    expect_error(f, {"big-endian"});
}

TEST_CASE("corrupt files: truncation in each section") {
    Bytes good = one_tensor_file();
    auto cut = [&](size_t n) { return Bytes{{good.b.begin(), good.b.begin() + n}}; };
    expect_error(cut(12), {"truncated", "tensor count", "header"});
    expect_error(cut(20), {"truncated", "metadata count"});
    expect_error(cut(44), {"tensor count 1 is impossible", "only 20 bytes", "truncated"});
    expect_error(cut(70), {"truncated", "tensor type", "tensor 'w'", "at byte offset 67"});
    expect_error(cut(85), {"truncated", "data section would start at byte 96"});
    expect_error(cut(100), {"tensor 'w'", "outside the file"});
}

TEST_CASE("corrupt files: truncated metadata") {
    Bytes f = header(0, 1);
    f.str("answer").u32(10).u64(42);  // 50 bytes
    auto cut = [&](size_t n) { return Bytes{{f.b.begin(), f.b.begin() + n}}; };
    expect_error(cut(30), {"metadata count 1 is impossible", "only 6 bytes"});
    expect_error(cut(37), {"key length 6 runs past the end", "metadata entry 0"});
    expect_error(cut(40), {"truncated", "value type", "key 'answer'"});
    expect_error(cut(46), {"truncated", "uint64 value", "key 'answer'", "at byte offset 42"});
    CHECK(GgufFile::from_memory(f.b.data(), f.b.size()).get_int("answer") == 42);
}

TEST_CASE("corrupt files: implausible counts and lengths") {
    expect_error(header(0, uint64_t{1} << 40), {"metadata count 1099511627776 is impossible"});
    expect_error(header(uint64_t{1} << 62, 0), {"tensor count", "is impossible"});
    Bytes both = header(2, 2);
    both.zeros(80);  // room for 2 tensor infos or 2 entries, not both
    expect_error(both, {"2 tensors and 2 metadata entries cannot fit in the 80 bytes"});

    Bytes f = header(0, 1);
    f.str("arr").u32(9).u32(4).u64(uint64_t{1} << 40).zeros(64);
    expect_error(f, {"array length 1099511627776 of uint32 is impossible", "key 'arr'"});

    f = header(0, 1);
    f.str("strs").u32(9).u32(8).u64(3).u64(2).put('a').put('b');
    expect_error(f, {"array length 3 of string is impossible", "key 'strs'"});
    f = header(0, 1);
    f.str("strs").u32(9).u32(8).u64(2).u64(1).put('a').u64(5).put('b');
    expect_error(f, {"string length 5 runs past the end", "key 'strs'"});

    f = header(0, 1);
    f.str("s").u32(8).u64(1000).zeros(3);
    expect_error(f, {"string length 1000 runs past the end", "key 's'"});

    f = header(0, 1);
    f.u64(uint64_t{1} << 50).zeros(16);
    expect_error(f, {"key length", "runs past the end", "metadata entry 0"});

    f = header(1, 0);
    f.u64(uint64_t{1} << 50).zeros(40);
    expect_error(f, {"tensor name length", "tensor #0"});

    // More array elements in total than the reader accepts (each element costs memory).
    const uint64_t n = (uint64_t{1} << 24) + 1;
    f = header(0, 1);
    f.str("big").u32(9).u32(0).u64(n).zeros(n);
    expect_error(f, {"more than 16777216 elements in total", "key 'big'"});
}

TEST_CASE("corrupt files: bad metadata values") {
    Bytes f = header(0, 1);
    f.str("x").u32(13).zeros(8);
    expect_error(f, {"unknown value type 13", "key 'x'", "at byte offset 33"});

    f = header(0, 1);
    f.str("x").u32(9).u32(99).u64(1).zeros(8);
    expect_error(f, {"unknown value type 99", "key 'x'"});

    f = header(0, 1);
    f.str("b").u32(7).put<uint8_t>(2);
    expect_error(f, {"bool value is 2", "key 'b'"});

    f = header(0, 1);
    f.str("deep").u32(9);
    for (int i = 0; i < 20; ++i) f.u32(9).u64(1);
    f.zeros(16);
    expect_error(f, {"nested more than 16 deep", "key 'deep'"});

    f = header(0, 2);
    f.kv_u32("k", 1).kv_u32("k", 2);
    expect_error(f, {"duplicate metadata key", "key 'k'", "at byte offset 41"});
}

TEST_CASE("corrupt files: alignment") {
    for (uint32_t bad : {0u, 3u, 48u, 0x80000000u}) {
        Bytes f = header(0, 1);
        f.kv_u32("general.alignment", bad);
        expect_error(f, {"alignment must be a power of two", "general.alignment"});
    }
    Bytes f = header(0, 2);
    f.kv_u32("n", 1).kv_u32("general.alignment", 0);
    expect_error(f, {"got 0 (uint32)", "at byte offset 41"});
    f = header(0, 1);
    f.str("general.alignment").u32(8).str("32");
    expect_error(f, {"alignment must be a power of two", "string"});

    // A declared alignment of 64 makes offset 32 misaligned.
    f = header(1, 1);
    f.kv_u32("general.alignment", 64).tensor("w", {4}, 0, 32).pad_to(64).zeros(64);
    expect_error(f, {"data offset 32 is not a multiple of the alignment 64", "tensor 'w'"});
    f = header(1, 1);
    f.kv_u32("general.alignment", 64).tensor("w", {4}, 0, 64).pad_to(64).zeros(80);
    GgufFile ok = GgufFile::from_memory(f.b.data(), f.b.size());
    CHECK(ok.alignment() == 64);
    CHECK(ok.data_offset() == 128);
}

TEST_CASE("corrupt files: bad tensor infos") {
    expect_error(one_tensor_file(4), {"unknown tensor type 4", "tensor 'w'"});
    expect_error(one_tensor_file(1000), {"unknown tensor type 1000", "tensor 'w'"});
    expect_error(one_tensor_file(0, {1, 1, 1, 1, 4}), {"dimension count 5 is not in 1..4"});
    expect_error(one_tensor_file(0, {}), {"dimension count 0 is not in 1..4", "tensor 'w'"});
    expect_error(one_tensor_file(0, {4, 0}), {"dimension 1 is 0", "tensor 'w'"});
    expect_error(one_tensor_file(0, {uint64_t{1} << 63}), {"dimension 0 is 9223372036854775808"});
    expect_error(one_tensor_file(0, {uint64_t{1} << 32, uint64_t{1} << 32}),
                 {"element count overflows", "tensor 'w'"});
    expect_error(one_tensor_file(0, {uint64_t{1} << 62}), {"byte size overflows", "tensor 'w'"});
    expect_error(one_tensor_file(2, {16}, 0, 18),
                 {"row length 16 is not a multiple of Q4_0's block size 32", "tensor 'w'"});
    expect_error(one_tensor_file(0, {4}, 4),
                 {"data offset 4 is not a multiple of the alignment 32"});
    expect_error(one_tensor_file(0, {4}, 1 << 20), {"outside the file", "tensor 'w'"});
    expect_error(one_tensor_file(0, {4}, 0xFFFFFFFFFFFFFFE0ull), {"outside the file"});
    expect_error(one_tensor_file(0, {1000}), {"+4000 bytes", "outside the file", "tensor 'w'"});

    Bytes f = header(2, 0);
    f.tensor("w", {4}, 0, 0).tensor("w", {4}, 0, 32).pad_to(32).zeros(64);
    expect_error(f, {"duplicate tensor name", "tensor 'w'", "at byte offset 57"});

    // Names in messages are escaped and shortened.
    f = header(1, 0);
    f.tensor("bad\x1b[31m" + std::string(200, 'n'), {4}, 99, 0).pad_to(32).zeros(16);
    std::string msg = parse_error(f.b);
    CHECK(msg.find("tensor 'bad\\x1b[31mnnn") != std::string::npos);
    CHECK(msg.find("n...'") != std::string::npos);
    CHECK(msg.size() < 250);

    // A Q4_0 tensor of 32x2 that fits exactly is fine.
    CHECK_NOTHROW(one_tensor_file(2, {32, 2}, 0, 36));
    Bytes q = one_tensor_file(2, {32, 2}, 0, 36);
    CHECK(GgufFile::from_memory(q.b.data(), q.b.size()).tensors()[0].n_bytes == 36);
    q.b.pop_back();
    expect_error(q, {"outside the file"});
}

TEST_CASE("corrupt files: tensors whose data overlap") {
    // Two 1-D F32 tensors; "b"'s info starts at 57 and its data offset field at 82.
    auto two = [](uint64_t a_elems, uint64_t a_off, uint64_t b_elems, uint64_t b_off) {
        Bytes f = header(2, 0);
        f.tensor("a", {a_elems}, 0, a_off).tensor("b", {b_elems}, 0, b_off).pad_to(32).zeros(256);
        return f;
    };
    expect_error(two(8, 0, 8, 0), {"tensor 'b', at byte offset 82",
                                   "data [0, +32 bytes) overlaps tensor 'a' at [0, +32 bytes)",
                                   "data section at byte 96"});
    expect_error(two(16, 0, 8, 32),
                 {"data [32, +32 bytes) overlaps tensor 'a' at [0, +64 bytes)", "tensor 'b'"});
    // Listed in the other order: reported at the later entry ("b"), naming "a".
    expect_error(two(8, 32, 16, 0), {"data [0, +64 bytes) overlaps tensor 'a' at [32, +32 bytes)",
                                     "tensor 'b', at byte offset 82"});
    // One byte of overlap is enough (Q8_0: 34 bytes per block).
    Bytes q = header(2, 0);
    q.tensor("a", {32}, 8, 0).tensor("b", {32}, 8, 32).pad_to(32).zeros(96);
    expect_error(q, {"data [32, +34 bytes) overlaps tensor 'a' at [0, +34 bytes)"});

    // A tensor inside a big one, with a third between them in sorted order.
    Bytes f = header(3, 0);
    f.tensor("big", {64}, 0, 0).tensor("mid", {8}, 0, 64).tensor("end", {8}, 0, 256);
    f.pad_to(32).zeros(288);
    GgufError e = parse_exception(f);
    CHECK(e.file() == "bad.gguf");
    CHECK(e.where() == "tensor 'mid'");
    CHECK(e.problem() ==
          "data [64, +32 bytes) overlaps tensor 'big' at [0, +256 bytes) "
          "(offsets relative to the data section at byte 160)");
    CHECK(e.offset() == std::optional<uint64_t>(86));

    // Touching tensors, and tensors stored out of order, are fine.
    Bytes ok = two(8, 0, 8, 32);
    CHECK(GgufFile::from_memory(ok.b.data(), ok.b.size()).tensors().size() == 2);
    ok = two(8, 64, 16, 0);
    GgufFile g = GgufFile::from_memory(ok.b.data(), ok.b.size(), "ok.gguf");
    CHECK(g.find_tensor("a")->data == g.find_tensor("b")->data + 64);
    try {
        g.fail_tensor("b", "has a shape kvrun cannot use");
        FAIL("fail_tensor returned");
    } catch (const GgufError& err) {
        CHECK(std::string(err.what()) ==
              "ok.gguf: has a shape kvrun cannot use (tensor 'b', at byte offset 57)");
        CHECK(err.offset() == std::optional<uint64_t>(57));
    }
}

TEST_CASE("getters: missing keys, wrong types, defaults") {
    GgufWriter w;
    w.set_u32("n", 7);
    w.set_string("s", "text");
    w.set_f32("x", 0.5f);
    w.set_bool("b", false);
    w.set_array_i32("a", {1});
    auto bytes = w.to_bytes();
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "g.gguf");
    auto message = [](auto&& fn) -> std::string {
        try {
            fn();
        } catch (const GgufError& e) {
            return e.what();
        }
        return "<no error>";
    };
    CHECK(message([&] { f.get_int("missing"); }) ==
          "g.gguf: required metadata key is missing (key 'missing')");
    // Entries follow the 24-byte header: "n" (17 bytes), "s" (25), "x" (17), "b" (14), "a".
    CHECK(message([&] { f.get_int("s"); }) ==
          "g.gguf: metadata value has type string, expected an integer (key 's', at byte "
          "offset 41)");
    CHECK(message([&] { f.get_string("n"); }) ==
          "g.gguf: metadata value has type uint32, expected string (key 'n', at byte offset "
          "24)");
    CHECK(message([&] { f.fail_key("a", "is odd"); }) ==
          "g.gguf: is odd (key 'a', at byte offset 97)");
    CHECK_THROWS_AS(f.get_bool("n"), GgufError);
    CHECK_THROWS_AS(f.get_array("n"), GgufError);
    CHECK_THROWS_AS(f.get_float("s"), GgufError);
    CHECK_THROWS_AS(f.get_int("x"), GgufError);
    CHECK(f.get_float("n") == 7.0);  // integers widen to float
    CHECK(f.get_float("x") == 0.5);
    CHECK(f.get_int_or("nope", -1) == -1);
    CHECK(f.get_int_or("n", -1) == 7);
    CHECK(f.get_float_or("nope", 2.5) == 2.5);
    CHECK(f.get_bool_or("nope", true));
    CHECK_FALSE(f.get_bool_or("b", true));
    CHECK(f.get_string_or("nope", "d") == "d");
    CHECK(f.get_string_or("s", "d") == "text");
    CHECK_THROWS_AS(f.get_int_or("s", 0), GgufError);
    CHECK(f.has("a"));
    CHECK_FALSE(f.has("A"));
    CHECK(f.find("a")->to_display() == "[1]");
}

TEST_CASE("open: missing file, directory, empty file") {
    auto msg = [](const std::string& p) -> std::string {
        try {
            GgufFile::open(p);
        } catch (const Error& e) {
            return e.what();
        }
        return "<no error>";
    };
    CHECK(msg("/nonexistent/model.gguf") ==
          "/nonexistent/model.gguf: cannot open: No such file or directory");
    fs::path dir = fs::temp_directory_path();
    CHECK(msg(dir.string()).find("not a regular file") != std::string::npos);
    fs::path empty = dir / ("kvrun_test_gguf_empty_" + std::to_string(getpid()));
    std::ofstream(empty).close();
    CHECK(msg(empty.string()).find("not a GGUF file") != std::string::npos);
    fs::remove(empty);
}

TEST_CASE("every strict prefix of a small file is rejected cleanly") {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_array_str("tokenizer.ggml.tokens", {"a", "bc", "def"});
    w.set_array_f32("scores", {1, 2, 3});
    w.set_value("nested",
                gguf_make_array(GgufValueType::ARRAY,
                                {gguf_make_array(GgufValueType::BOOL, {gguf_make_bool(true)})}));
    std::vector<uint8_t> q(2 * 34, 1), f32(64, 2);  // sizes are multiples of 32: no tail pad
    w.add_tensor("q", GgmlType::Q8_0, {64}, q.data(), q.size());
    w.add_tensor("f", GgmlType::F32, {16}, f32.data(), f32.size());
    std::vector<uint8_t> bytes = w.to_bytes();
    REQUIRE(bytes.size() % 32 == 0);
    for (size_t n = 0; n < bytes.size(); ++n) {
        std::string msg = parse_error({bytes.begin(), bytes.begin() + n});
        if (msg.rfind("bad.gguf: ", 0) != 0) FAIL("prefix " << n << ": " << msg);
    }
    CHECK_NOTHROW(GgufFile::from_memory(bytes.data(), bytes.size()));
}

TEST_CASE("prefixes of a real model are rejected cleanly") {
    fs::path path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    GgufFile full = GgufFile::from_memory(bytes.data(), bytes.size());
    const size_t header_end = full.data_offset() + 64;
    int rejected = 0;
    for (size_t n = 0; n < bytes.size(); n += (n < header_end ? 1 : 4099)) {
        std::string msg = parse_error({bytes.begin(), bytes.begin() + n});
        if (msg.rfind("bad.gguf: ", 0) != 0) FAIL("prefix " << n << ": " << msg);
        ++rejected;
    }
    CHECK(rejected > 14000);
}

TEST_CASE("every shared model opens with known tensor types") {
    auto models = test::shared_models();
    if (models.empty()) {
        MESSAGE("SKIP: no shared models");
        return;
    }
    CHECK(models.size() >= 37);
    for (const fs::path& p : models) {
        INFO(p.filename().string());
        GgufFile f = GgufFile::open(p.string());
        CHECK(f.version() >= 2);
        CHECK(f.tensors().size() > 0);
        CHECK(f.has("general.architecture"));
        CHECK(f.get_array("tokenizer.ggml.tokens").size() > 0);
        for (const GgufTensorInfo& t : f.tensors()) {
            CHECK(ggml_type_known(static_cast<uint32_t>(t.type)));
            CHECK(t.n_bytes == ggml_row_bytes(t.type, t.dims[0]) *
                                   static_cast<uint64_t>(t.n_elements / t.dims[0]));
            CHECK(t.data >= reinterpret_cast<const uint8_t*>(f.find_tensor(t.name)->data));
            CHECK(t.offset + t.n_bytes <= f.file_size() - f.data_offset());
        }
    }
}

TEST_CASE("stories260K hyperparameters") {
    fs::path path = test::shared_path("models/stories260K.gguf");
    if (path.empty()) return;
    GgufFile f = GgufFile::open(path.string());
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("llama.block_count") == 5);
    CHECK(f.get_int("llama.embedding_length") == 64);
    CHECK(f.get_int("llama.attention.head_count") == 8);
    CHECK(f.get_int("llama.attention.head_count_kv") == 4);
    CHECK(f.get_int("llama.feed_forward_length") == 172);
    CHECK(f.get_int("llama.rope.dimension_count") == 8);
    CHECK(std::abs(f.get_float("llama.attention.layer_norm_rms_epsilon") - 1e-5) < 1e-9);
    CHECK(f.get_string("tokenizer.ggml.model") == "llama");
    const auto& tokens = f.get_array("tokenizer.ggml.tokens");
    REQUIRE(tokens.size() == 512);
    CHECK(tokens[1].as_string() == "<s>");
    CHECK(f.get_array("tokenizer.ggml.scores").size() == 512);
    CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
    CHECK(f.tensors().size() == 48);  // 3 + 5 layers x 9
    const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
    REQUIRE(emb);
    CHECK(emb->type == GgmlType::F32);
    CHECK(emb->dims == std::vector<int64_t>{64, 512});
    const GgufTensorInfo* down = f.find_tensor("blk.4.ffn_down.weight");
    REQUIRE(down);
    CHECK(down->dims == std::vector<int64_t>{172, 64});
}

TEST_CASE("every shared vocabulary file opens") {
    fs::path dir = test::shared_path("vocab");
    if (dir.empty()) return;
    int opened = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".gguf") continue;
        INFO(e.path().filename().string());
        GgufFile f = GgufFile::open(e.path().string());
        CHECK(f.tensors().empty());
        CHECK(!f.get_string("tokenizer.ggml.model").empty());
        const auto& tokens = f.get_array("tokenizer.ggml.tokens");
        CHECK(tokens.size() > 100);
        CHECK(f.find("tokenizer.ggml.tokens")->array_type == GgufValueType::STRING);
        ++opened;
    }
    CHECK(opened >= 12);
}

TEST_CASE("override_value replaces or adds metadata; errors about an added key still work") {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.block_count", 2);
    const auto bytes = w.to_bytes();
    GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "o.gguf");
    f.override_value("llama.block_count", gguf_make_int(GgufValueType::INT64, 7));
    f.override_value("tokenizer.ggml.add_bos_token", gguf_make_bool(false));
    CHECK(f.get_int("llama.block_count") == 7);
    CHECK_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
    CHECK(f.metadata().size() == 3);
    CHECK(f.find("tokenizer.ggml.add_bos_token") == &f.metadata().back().second);
    CHECK_THROWS_WITH_AS(f.get_string("tokenizer.ggml.add_bos_token"),
                         doctest::Contains("tokenizer.ggml.add_bos_token"), GgufError);
}
