// Split models (llama.cpp's gguf-split layout): the first file's metadata, every file's
// tensors, found by the PREFIX-0000i-of-0000N.gguf names; bad splits give one clear error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "quant.h"
#include "test_util.h"

using namespace kvrun;
using kvrun::test::run_command;
using kvrun::test::shared_model;
namespace cli = kvrun::test::cli;
namespace fs = std::filesystem;

namespace {

// What to get wrong when writing the split.
struct SplitFaults {
    int shard_no_of_file_2 = -1;  // >= 0: file 2 claims this split.no
    bool duplicate_tensor = false;
    int64_t tensors_count_delta = 0;
};

// Writes `src` as `n` files PREFIX-0000i-of-0000n.gguf (the metadata and split keys in the
// first, only the split keys in the others, tensors dealt in turn); returns the paths.
std::vector<std::string> write_split(const GgufFile& src, const std::string& prefix, int n,
                                     SplitFaults faults = {}) {
    std::vector<std::string> paths;
    const auto& tensors = src.tensors();
    for (int i = 0; i < n; ++i) {
        GgufWriter w(uint32_t(src.alignment()));
        if (i == 0)
            for (const auto& [k, v] : src.metadata()) w.set_value(k, v);
        const int no = i == 1 && faults.shard_no_of_file_2 >= 0 ? faults.shard_no_of_file_2 : i;
        w.set_u16("split.no", uint16_t(no));
        w.set_u16("split.count", uint16_t(n));
        w.set_i32("split.tensors.count",
                  int32_t(tensors.size() + size_t(faults.tensors_count_delta)));
        for (size_t t = size_t(i); t < tensors.size(); t += size_t(n))
            w.add_tensor(tensors[t].name, tensors[t].type, tensors[t].dims, tensors[t].data,
                         tensors[t].n_bytes);
        if (faults.duplicate_tensor && i == n - 1)
            w.add_tensor(tensors[0].name, tensors[0].type, tensors[0].dims, tensors[0].data,
                         tensors[0].n_bytes);
        paths.push_back(prefix + fmt::format("-{:05d}-of-{:05d}.gguf", i + 1, n));
        w.write_file(paths.back());
    }
    return paths;
}

std::string temp_prefix(const std::string& tag) {
    return cli::temp_path("split_" + tag);
}

void remove_all(const std::vector<std::string>& paths) {
    for (const auto& p : paths) fs::remove(p);
}

}  // namespace

TEST_CASE("a split model opens by its first file, with every file's tensors") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    GgufFile whole = GgufFile::open(path.string());
    const auto paths = write_split(whole, temp_prefix("ok"), 3);
    {
        GgufFile split = GgufFile::open(paths[0]);
        CHECK(split.n_splits() == 3);
        CHECK(split.get_string("general.architecture") == "llama");
        REQUIRE(split.tensors().size() == whole.tensors().size());
        for (const GgufTensorInfo& t : whole.tensors()) {
            INFO(t.name);
            const GgufTensorInfo* s = split.find_tensor(t.name);
            REQUIRE(s != nullptr);
            CHECK(s->type == t.type);
            CHECK(s->dims == t.dims);
            REQUIRE(s->n_bytes == t.n_bytes);
            CHECK(std::equal(t.data, t.data + t.n_bytes, s->data));
        }
        // Moving the file keeps the other files' mappings alive.
        GgufFile moved = std::move(split);
        const GgufTensorInfo* last = moved.find_tensor(whole.tensors().back().name);
        CHECK(std::equal(last->data, last->data + last->n_bytes, whole.tensors().back().data));
    }
    // The same text as the whole file, through the program; and --no-mmap reads every file.
    const std::string args = " -p 'Once upon a time' -n 24 --temp 0";
    auto a = run_command(cli::kvrun_cmd("run -m " + path.string() + args));
    auto b = run_command(cli::kvrun_cmd("run -m " + paths[0] + args));
    auto c = run_command(cli::kvrun_cmd("run --no-mmap -m " + paths[0] + args));
    CHECK_MESSAGE(b.exit_code == 0, b.err);
    CHECK(a.out.size() > 40);
    CHECK(b.out == a.out);
    CHECK(c.out == a.out);
    // quantize merges it into one file.
    const std::string out = temp_prefix("merged") + ".gguf";
    auto q = run_command(cli::kvrun_cmd("quantize -q " + paths[0] + " " + out + " Q8_0"));
    CHECK_MESSAGE(q.exit_code == 0, q.err);
    GgufFile merged = GgufFile::open(out);
    CHECK(merged.n_splits() == 1);
    CHECK_FALSE(merged.has("split.count"));
    CHECK(merged.tensors().size() == whole.tensors().size());
    fs::remove(out);
    remove_all(paths);
}

TEST_CASE("quantize --keep-split writes as many files, each with its input file's tensors") {
    auto path = shared_model("stories260K.gguf");
    auto ref = shared_model("stories260K-Q8_0.gguf");
    if (path.empty() || ref.empty()) return;
    GgufFile whole = GgufFile::open(path.string());
    const auto paths = write_split(whole, temp_prefix("in"), 3);
    const std::string out = temp_prefix("out");
    auto q = run_command(
        cli::kvrun_cmd("quantize -q --keep-split " + paths[0] + " " + out + ".gguf Q8_0"));
    REQUIRE_MESSAGE(q.exit_code == 0, q.err);
    std::vector<std::string> outs;
    for (int i = 1; i <= 3; ++i) outs.push_back(out + fmt::format("-{:05d}-of-00003.gguf", i));
    for (const std::string& p : outs) REQUIRE(fs::exists(p));
    CHECK_FALSE(fs::exists(out + ".gguf"));
    {
        GgufFile got = GgufFile::open(outs[0]), in = GgufFile::open(paths[0]);
        GgufFile want = GgufFile::open(ref.string());
        CHECK(got.n_splits() == 3);
        CHECK(got.get_int("general.file_type") == 7);
        REQUIRE(got.tensors().size() == want.tensors().size());
        for (const GgufTensorInfo& t : got.tensors()) {
            INFO(t.name);
            CHECK(t.split == in.find_tensor(t.name)->split);  // the same file as its input
            const GgufTensorInfo* w = want.find_tensor(t.name);
            REQUIRE(w != nullptr);
            REQUIRE(w->n_bytes == t.n_bytes);
            CHECK(std::equal(t.data, t.data + t.n_bytes, w->data));  // llama-quantize's bytes
        }
    }
    const std::string args = " -p 'Once upon a time' -n 16 --temp 0";
    CHECK(run_command(cli::kvrun_cmd("run -m " + outs[0] + args)).out ==
          run_command(cli::kvrun_cmd("run -m " + ref.string() + args)).out);
    remove_all(outs);
    remove_all(paths);
}

TEST_CASE("bad split models: one clear error each") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    GgufFile whole = GgufFile::open(path.string());
    SUBCASE("a later file names the first one") {
        const auto paths = write_split(whole, temp_prefix("later"), 2);
        CHECK_THROWS_WITH_AS(GgufFile::open(paths[1]),
                             doctest::Contains("file 2 of a model split into 2"), Error);
        auto r = run_command(cli::kvrun_cmd("run -m " + paths[1] + " -p hi"));
        cli::check_one_line_with_hint(r, "-00001-of-00002.gguf");
        remove_all(paths);
    }
    SUBCASE("a missing file is named") {
        const auto paths = write_split(whole, temp_prefix("missing"), 3);
        fs::remove(paths[2]);
        CHECK_THROWS_WITH_AS(GgufFile::open(paths[0]), doctest::Contains("-00003-of-00003.gguf"),
                             Error);
        remove_all(paths);
    }
    SUBCASE("a renamed first file") {
        const auto paths = write_split(whole, temp_prefix("renamed"), 2);
        const std::string renamed = temp_prefix("renamed") + ".gguf";
        fs::rename(paths[0], renamed);
        CHECK_THROWS_WITH_AS(GgufFile::open(renamed), doctest::Contains("must be named"), Error);
        fs::remove(renamed);
        remove_all(paths);
    }
    SUBCASE("a file that claims another place, a tensor twice, a wrong tensor count") {
        auto paths = write_split(whole, temp_prefix("wrongno"), 3, {.shard_no_of_file_2 = 2});
        CHECK_THROWS_WITH_AS(GgufFile::open(paths[0]), doctest::Contains("not file 2 of 3"),
                             GgufError);
        remove_all(paths);
        paths = write_split(whole, temp_prefix("dup"), 2, {.duplicate_tensor = true});
        CHECK_THROWS_WITH_AS(GgufFile::open(paths[0]), doctest::Contains("also in an earlier file"),
                             GgufError);
        remove_all(paths);
        paths = write_split(whole, temp_prefix("count"), 2, {.tensors_count_delta = 1});
        CHECK_THROWS_WITH_AS(GgufFile::open(paths[0]), doctest::Contains("split.tensors.count"),
                             GgufError);
        remove_all(paths);
    }
}

TEST_CASE("gguf-split: splits by tensors or size, merges back to the same bytes") {
    auto path = shared_model("stories260K.gguf");
    if (path.empty()) return;
    const GgufFile src = GgufFile::open(path.string());
    const std::string prefix = temp_prefix("tool");
    auto one_file = [](const std::string& p) {  // one file of a split, without the others
        const std::string bytes = cli::read_all(p);
        return GgufFile::from_memory(bytes.data(), bytes.size(), p);
    };
    auto shards_of = [&](const std::string& p, int n) {
        std::vector<std::string> out;
        for (int i = 1; i <= n; ++i) out.push_back(p + fmt::format("-{:05d}-of-{:05d}.gguf", i, n));
        return out;
    };
    // 48 tensors by 10: five files; every file carries the split keys, the first the metadata.
    auto r = run_command(
        cli::kvrun_cmd("gguf-split --split-max-tensors 10 " + path.string() + " " + prefix));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const size_t n_tensors = src.tensors().size();
    const int n = int((n_tensors + 9) / 10);
    const std::vector<std::string> shards = shards_of(prefix, n);
    size_t total = 0;
    for (int i = 0; i < n; ++i) {
        GgufFile f = one_file(shards[size_t(i)]);
        CHECK(f.get_int("split.no") == i);
        CHECK(f.get_int("split.count") == n);
        CHECK(f.get_int("split.tensors.count") == int64_t(n_tensors));
        CHECK(f.has("general.architecture") == (i == 0));
        CHECK(f.tensors().size() <= 10);
        total += f.tensors().size();
    }
    CHECK(total == n_tensors);
    // The split model is the model: every tensor's bytes, and the same greedy text.
    const GgufFile split = GgufFile::open(shards[0]);
    for (const GgufTensorInfo& t : src.tensors()) {
        const GgufTensorInfo* s = split.find_tensor(t.name);
        REQUIRE(s);
        CHECK(std::memcmp(s->data, t.data, t.n_bytes) == 0);
    }
    const std::string args = " -p 'Once upon a time' -n 16 --temp 0";
    CHECK(run_command(cli::kvrun_cmd("run -m " + shards[0] + args)).out ==
          run_command(cli::kvrun_cmd("run -m " + path.string() + args)).out);
    // Merged: the bytes `quantize COPY` writes for the original.
    const std::string merged = prefix + "-merged.gguf", copy = prefix + "-copy.gguf";
    REQUIRE(
        run_command(cli::kvrun_cmd("gguf-split --merge " + shards[0] + " " + merged)).exit_code ==
        0);
    REQUIRE(run_command(cli::kvrun_cmd("quantize -q " + path.string() + " " + copy + " COPY"))
                .exit_code == 0);
    CHECK(cli::read_all(merged) == cli::read_all(copy));
    remove_all(shards);
    remove_all({merged, copy});

    // By size, metadata alone in the first file; --dry-run writes nothing.
    auto d = run_command(cli::kvrun_cmd("gguf-split --dry-run --split-max-size 300K " +
                                        path.string() + " " + prefix));
    CHECK(d.exit_code == 0);
    CHECK(d.err.find("would write") != std::string::npos);
    CHECK(!fs::exists(shards_of(prefix, 5)[0]));
    r = run_command(cli::kvrun_cmd("gguf-split --split-max-size 300K --no-tensor-first-split " +
                                   path.string() + " " + prefix));
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    std::vector<std::string> sized;
    for (const auto& e : fs::directory_iterator(fs::path(prefix).parent_path()))
        if (e.path().string().rfind(prefix + "-0", 0) == 0) sized.push_back(e.path().string());
    std::sort(sized.begin(), sized.end());
    REQUIRE(sized.size() >= 3);
    CHECK(one_file(sized[0]).tensors().empty());
    for (size_t i = 1; i < sized.size(); ++i) {
        GgufFile f = one_file(sized[i]);
        uint64_t bytes = 0;
        for (const GgufTensorInfo& t : f.tensors()) bytes += t.n_bytes;
        CHECK((bytes <= 300000 || f.tensors().size() == 1));
    }
    CHECK(GgufFile::open(sized[0]).tensors().size() == n_tensors);
    remove_all(sized);

    // Bad flags: one clear line each.
    cli::check_one_clear_error(
        run_command(cli::kvrun_cmd("gguf-split --split-max-size 2Q " + path.string() + " x")),
        "--split-max-size '2Q'");
    cli::check_one_clear_error(
        run_command(
            cli::kvrun_cmd("gguf-split --merge --split-max-tensors 3 " + path.string() + " x")),
        "--merge takes no split limits");
}
