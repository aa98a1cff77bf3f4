// Perplexity against llama.cpp's numbers (../shared/reference/perplexity.tsv) on the
// stories260K family, and the KL-divergence save/compare round trip.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "backend.h"
#include "choice_eval.h"
#include "kv_block_table.h"
#include "perplexity.h"
#include "test_util.h"
#include "text_input.h"

using namespace kvrun;

namespace {

struct RefPpl {
    double ppl = 0, err = 0;
    int chunks = 0;
};

std::map<std::string, RefPpl> load_reference(const std::filesystem::path& tsv) {
    std::map<std::string, RefPpl> out;
    std::ifstream in(tsv);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
        std::istringstream ss(line);
        std::string model, file;
        int ctx;
        RefPpl r;
        ss >> model >> file >> ctx >> r.chunks >> r.ppl >> r.err;
        out[model] = r;
    }
    return out;
}

PerplexityResult eval(const std::filesystem::path& model, const std::string& text, int chunks,
                      KvType kv = KvType::F16, const std::string& save = {},
                      const std::string& base = {}, int32_t n_batch = 256) {
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    BackendOptions bo;
    bo.n_kv_blocks = std::max(256, n_batch) / bo.kv_block_size;
    bo.kv_type_k = bo.kv_type_v = kv;
    auto backend = make_cpu_backend(f, bo);
    PerplexityOptions po;
    po.n_ctx = 256;
    po.n_batch = n_batch;
    po.n_chunks = chunks;
    po.kld_save = save;
    po.kld_base = base;
    return perplexity_run(*backend, *tok, text, po);
}

}  // namespace

TEST_CASE("perplexity matches llama.cpp within 0.5% on the stories260K family") {
    auto dir = kvrun::test::shared_dir();
    if (dir.empty()) {
        MESSAGE("SKIP: ../shared not found");
        return;
    }
    auto ref = load_reference(dir / "reference/perplexity.tsv");
    const std::string text = read_file_text((dir / "text/wiki.test.raw").string());
    int n = 0;
    for (const auto& model : kvrun::test::shared_models()) {
        const std::string name = model.filename().string();
        if (name.rfind("stories260K", 0) != 0 || name.find("w256") != std::string::npos) continue;
        REQUIRE(ref.count(name));
        const RefPpl& r = ref[name];
        PerplexityResult res = eval(model, text, r.chunks);
        const double rel = std::abs(res.ppl - r.ppl) / r.ppl;
        MESSAGE(name << ": PPL " << res.ppl << " (llama.cpp " << r.ppl << ", " << 100 * rel
                     << "%)");
        CHECK_MESSAGE(rel < 0.005, name);
        CHECK(res.ppl_stderr == doctest::Approx(r.err).epsilon(0.02));
        CHECK(res.n_chunks == r.chunks);
        ++n;
    }
    CHECK(n >= 13);
}

TEST_CASE("KL divergence: a run compared with itself is zero; f32 vs f16 KV is tiny") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string text =
        read_file_text((kvrun::test::shared_dir() / "text/wiki.test.raw").string());
    auto tmp = std::filesystem::temp_directory_path() / ("kvrun_kld_" + std::to_string(::getpid()));
    PerplexityResult base = eval(model, text, 3, KvType::F32, tmp.string());
    PerplexityResult self = eval(model, text, 3, KvType::F32, {}, tmp.string());
    CHECK(self.has_kld);
    CHECK(self.kld_mean < 1e-9);  // the same computation: identical log-probs
    CHECK(self.top1_agreement == 1.0);
    CHECK(self.base_ppl == doctest::Approx(base.ppl).epsilon(1e-3));
    // llama-perplexity's fuller statistics: a run against itself is exact agreement.
    CHECK(self.ln_ratio == doctest::Approx(0.0));
    CHECK(self.ppl_ratio == doctest::Approx(1.0));
    CHECK(self.nll_correlation == doctest::Approx(1.0));
    CHECK(self.dp_rms < 1e-9);
    REQUIRE(self.kld_quantiles.size() == 11);
    for (const auto& [q, v] : self.kld_quantiles) CHECK(v < 1e-9);
    PerplexityResult f16 = eval(model, text, 3, KvType::F16, {}, tmp.string());
    CHECK(f16.kld_mean < 1e-3);
    CHECK(f16.top1_agreement > 0.98);
    CHECK(f16.nll_correlation > 0.999);
    CHECK(f16.ppl_ratio == doctest::Approx(f16.ppl / f16.base_ppl).epsilon(1e-9));
    CHECK(f16.dp_rms < 0.01);
    // Quantiles run from the maximum down to the minimum, the median in between.
    REQUIRE(f16.kld_quantiles.size() == 11);
    CHECK(f16.kld_quantiles.front().second == doctest::Approx(f16.kld_max));
    for (size_t i = 1; i < f16.kld_quantiles.size(); ++i) {
        CHECK(f16.kld_quantiles[i].second <= f16.kld_quantiles[i - 1].second);
        CHECK(f16.dp_quantiles[i].second <= f16.dp_quantiles[i - 1].second);
    }
    CHECK(f16.kld_p99 == f16.kld_quantiles[2].second);
    // A base file from another context length is rejected with a clear error.
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    BackendOptions bo;
    auto backend = make_cpu_backend(f, bo);
    PerplexityOptions po;
    po.n_ctx = 128;
    po.n_chunks = 2;
    po.kld_base = tmp.string();
    CHECK_THROWS_WITH_AS(perplexity_run(*backend, *tok, text, po), doctest::Contains("-c 256"),
                         Error);
    std::filesystem::remove(tmp);
}

TEST_CASE("perplexity rejects a text shorter than two chunks") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    auto backend = make_cpu_backend(f, BackendOptions{});
    PerplexityOptions po;
    po.n_ctx = 256;
    CHECK_THROWS_WITH_AS(perplexity_run(*backend, *tok, "Once upon a time", po),
                         doctest::Contains("needs at least 512"), Error);
}

namespace {

// Four tasks in llama.cpp's layout whose gold ending is the one a TinyStories model expects.
const char* kHellaswagTasks =
    "Story: Once upon a time, there was a little girl named Lily. She loved to\n2\n"
    "zebra quantum purple sideways the the the.\neat rocks under the blue computer.\n"
    "play outside in the park with her friends.\nfly a spaceship to the moon and back.\n"
    "Story: One day, Tom saw a big red\n1\nelephant typing on a keyboard in space.\n"
    "ball in the park.\nmathematics theorem proving engine.\nis the of and to a in.\n"
    "Story: Lily was very happy. She said, \"Thank you, mom!\" Her mom\n0\n"
    "smiled and gave her a big hug.\ncomputed the eigenvalues of a matrix.\n"
    "sold the house to a robot.\nthe the the the the the.\n"
    "Story: The little dog wanted to play. He ran to the\n3\n"
    "quantum chromodynamics lecture hall.\nstock exchange in Tokyo.\nthe and of to in is.\n"
    "park and played with a ball.\n";

// The mean log-probability of `ending`'s tokens after `context` computed the plain way: the
// whole candidate in one sequence of its own, every position's logits.
double plain_range_score(Backend& backend, const std::vector<TokenId>& t, size_t from, size_t to);

double plain_ending_score(Backend& backend, const Tokenizer& tok, const std::string& context,
                          const std::string& ending, size_t common) {
    const std::vector<TokenId> t = tok.encode(context + " " + ending, tok.add_bos());
    return plain_range_score(backend, t, common, t.size());
}

// The mean log-probability of tokens [from, to) of `t`, run alone with every position's logits.
double plain_range_score(Backend& backend, const std::vector<TokenId>& t, size_t from, size_t to) {
    KvBlockTable table = kv_table_for(backend);
    const SeqId s = table.create_sequence();
    REQUIRE(table.append(s, t));
    kv_apply_pending(table, backend);
    ForwardBatch fb;
    fb.add_sequence(table, s, 0, int32_t(t.size()));
    for (int32_t i = 0; i < int32_t(t.size()); ++i) fb.logit_rows.push_back(i);
    const int64_t nv = backend.config().n_vocab;
    std::vector<float> logits(t.size() * size_t(nv));
    backend.forward(fb, logits.data());
    double sum = 0;
    for (size_t i = from; i < to; ++i) {
        const float* row = logits.data() + (i - 1) * size_t(nv);
        double mx = row[0], z = 0;
        for (int64_t v = 1; v < nv; ++v) mx = std::max(mx, double(row[v]));
        for (int64_t v = 0; v < nv; ++v) z += std::exp(double(row[v]) - mx);
        sum += double(row[t[i]]) - mx - std::log(z);
    }
    return sum / double(to - from);
}

}  // namespace

TEST_CASE("HellaSwag: the file layout, llama.cpp's task draw and Wilson interval") {
    const auto tasks = hellaswag_parse(kHellaswagTasks, "hs.txt");
    REQUIRE(tasks.size() == 4);
    CHECK(tasks[1].gold == 1);
    CHECK(tasks[3].endings[3] == "park and played with a ball.");
    CHECK_THROWS_WITH_AS(hellaswag_parse("a\n1\nb\nc\nd\n", "x.txt"),
                         doctest::Contains("x.txt: 5 lines, not a multiple of 6"), Error);
    CHECK_THROWS_WITH_AS(hellaswag_parse("a\n7\nb\nc\nd\ne\n", "x.txt"),
                         doctest::Contains("x.txt:2: the gold ending index is '7', not 0..3"),
                         Error);
    // The draw: the same every time, a permutation when it takes them all.
    const auto a = hellaswag_select(tasks, 10), b = hellaswag_select(tasks, 10);
    REQUIRE(a.size() == 4);
    std::set<std::string> contexts;
    for (size_t i = 0; i < 4; ++i) {
        CHECK(a[i].context == b[i].context);
        contexts.insert(a[i].context);
    }
    CHECK(contexts.size() == 4);
    CHECK(hellaswag_select(tasks, 2).size() == 2);
    // llama.cpp's interval for one correct task of one, and 3 of 4.
    const HellaswagScore one = hellaswag_score(1, 1);
    CHECK(one.acc == doctest::Approx(100.0));
    CHECK(one.lo == doctest::Approx(20.6549).epsilon(1e-5));
    CHECK(one.hi == doctest::Approx(100.0));
    const HellaswagScore s = hellaswag_score(3, 4);
    CHECK(s.acc == doctest::Approx(75.0));
    CHECK(s.lo == doctest::Approx(30.0636).epsilon(1e-4));
    CHECK(s.hi == doctest::Approx(95.4407).epsilon(1e-4));
}

TEST_CASE("HellaSwag on stories260K: shared prefix forked, scores as computed one by one") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    const auto tasks = hellaswag_parse(kHellaswagTasks, "hs.txt");
    for (KvType kv : {KvType::F16, KvType::Q8}) {
        CAPTURE(std::string(kv_type_name(kv)));
        for (int32_t n_batch : {512, 5}) {  // one pass per part, or many
            CAPTURE(n_batch);
            BackendOptions bo;
            bo.kv_block_size = 4;
            bo.n_kv_blocks = 64;
            bo.kv_type_k = bo.kv_type_v = kv;
            auto backend = make_cpu_backend(f, bo);
            std::vector<HellaswagTaskResult> results;
            const HellaswagScore s =
                hellaswag_run(*backend, *tok, tasks, n_batch,
                              [&](size_t, const HellaswagTaskResult& r, const HellaswagScore&) {
                                  results.push_back(r);
                              });
            CHECK(s.n_tasks == 4);
            CHECK(s.n_correct == 4);
            REQUIRE(results.size() == 4);
            if (kv != KvType::F16) continue;
            // Task 0's endings, scored alone from their first token after the shared part.
            std::array<std::vector<TokenId>, 4> t;
            for (size_t e = 0; e < 4; ++e)
                t[e] = tok->encode(tasks[0].context + " " + tasks[0].endings[e], tok->add_bos());
            size_t common = 0;
            while (t[0][common] == t[1][common] && t[0][common] == t[2][common] &&
                   t[0][common] == t[3][common])
                ++common;
            for (size_t e = 0; e < 4; ++e)
                CHECK(results[0].score[e] ==
                      doctest::Approx(plain_ending_score(*backend, *tok, tasks[0].context,
                                                         tasks[0].endings[e], common))
                          .epsilon(1e-5));
        }
    }
    // A pool too small for a task is one clear Error.
    BackendOptions tiny;
    tiny.kv_block_size = 4;
    tiny.n_kv_blocks = 3;
    auto small = make_cpu_backend(f, tiny);
    CHECK_THROWS_WITH_AS(hellaswag_run(*small, *tok, tasks, 512),
                         doctest::Contains("does not fit in the KV pool"), Error);
}

TEST_CASE("perplexity --hellaswag: llama.cpp's table on stdout, clear errors") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    kvrun::test::TempDir dir;
    const std::string file = dir.write("hs.txt", kHellaswagTasks);
    const std::string base =
        kvrun::test::kvrun_binary() + " perplexity -m " + model.string() + " --device cpu -f ";
    auto r = kvrun::test::run_command(base + file + " --hellaswag --hellaswag-tasks 3");
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.rfind("task\tacc_norm\t95% confidence interval\n1\t100.00000000%\t[20.6549%, "
                      "100.0000%]\n2\t",
                      0) == 0);
    CHECK(r.out.find("Final HellaSwag: acc_norm = 100.0000% [43.8503%, 100.0000%] over 3 tasks") !=
          std::string::npos);
    CHECK(r.err.find("3 of 4 tasks") != std::string::npos);
    auto bad = kvrun::test::run_command(base + dir.write("bad.txt", "a\nb\n") + " --hellaswag");
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("2 lines, not a multiple of 6") != std::string::npos);
    auto both = kvrun::test::run_command(base + file + " --hellaswag --kld x");
    CHECK(both.exit_code == 1);
    CHECK(both.err.find("--kld excludes --hellaswag") != std::string::npos);
}

namespace {

// llama.cpp's binary multiple-choice layout (see choice_eval.h) for `tasks`; mc2 repeats mc1.
std::string multiple_choice_file(const std::vector<ChoiceTask>& tasks) {
    auto u32 = [](std::string& out, uint32_t v) { out.append(reinterpret_cast<char*>(&v), 4); };
    auto text = [&](std::string& out, const std::string& s) {
        u32(out, uint32_t(s.size()));
        out += s;
    };
    std::vector<std::string> bodies;
    for (const ChoiceTask& t : tasks) {
        std::string b;
        text(b, t.question);
        for (int set = 0; set < 2; ++set) {
            u32(b, uint32_t(t.answers.size()));
            for (const auto& a : t.answers) text(b, a);
            for (int32_t l : t.labels) u32(b, uint32_t(l));
        }
        bodies.push_back(b);
    }
    std::string out;
    u32(out, uint32_t(tasks.size()));
    uint32_t at = 4 + 4 * uint32_t(tasks.size());
    for (const auto& b : bodies) u32(out, at), at += uint32_t(b.size());
    for (const auto& b : bodies) out += b;
    return out;
}

std::vector<ChoiceTask> story_choice_tasks() {
    return {{"Once upon a time, there was a little girl named Lily. She loved to",
             {"zebra quantum purple sideways.", "play outside in the park."},
             {0, 1}},
            {"One day, Tom saw a big red",
             {"ball in the park.", "elephant typing on a keyboard.", "mathematics theorem engine."},
             {1, 0, 0}},
            {"Lily was very happy. She said, \"Thank you, mom!\" Her mom",
             {"computed eigenvalues.", "sold the house to a robot.", "the the the the.",
              "quantum chromodynamics lecture.", "smiled and gave her a big hug."},
             {0, 0, 0, 0, 1}}};
}

}  // namespace

TEST_CASE("multiple choice: llama.cpp's binary files, the draw, and malformed files") {
    const std::string file = multiple_choice_file(story_choice_tasks());
    size_t n = 0;
    const auto all = multiple_choice_load(file, "mc.bin", 0, &n);
    CHECK(n == 3);
    REQUIRE(all.size() == 3);
    CHECK(all[2].answers.size() == 5);
    CHECK(all[2].labels[4] == 1);
    CHECK(all[1].question == "One day, Tom saw a big red");
    CHECK(multiple_choice_load(file, "mc.bin", 7).size() == 3);
    const auto two = multiple_choice_load(file, "mc.bin", 2);
    REQUIRE(two.size() == 2);
    CHECK(two[0].question != two[1].question);
    CHECK(multiple_choice_load(file, "mc.bin", 2)[1].question == two[1].question);
    auto refused = [](const std::string& bytes, const char* needle, size_t n_tasks = 0) {
        CHECK_THROWS_WITH_AS(multiple_choice_load(bytes, "mc.bin", n_tasks),
                             doctest::Contains(needle), Error);
    };
    refused(file.substr(0, file.size() - 1), "the file ends inside a number");
    refused(file.substr(0, 2), "the file ends inside a number");
    refused(std::string(4, '\0'), "no tasks");
    refused(std::string("\xff\xff\xff\x0f", 4), "tasks do not fit the file");
    auto tasks = story_choice_tasks();
    tasks[0].answers.assign(101, "x"), tasks[0].labels.assign(101, 0);
    refused(multiple_choice_file(tasks), "task 1 has 101 answers (1..100)");
    tasks = story_choice_tasks();
    tasks[1].question = "";
    refused(multiple_choice_file(tasks), "task 2 has an empty question");
    tasks = story_choice_tasks();
    tasks[2].answers[0] = "bad \xc3";
    refused(multiple_choice_file(tasks), "an answer is not UTF-8");
    std::string far = file;
    const uint32_t past = uint32_t(file.size() + 10);
    std::memcpy(far.data() + 4, &past, 4);
    std::memcpy(far.data() + 8, &past, 4);
    std::memcpy(far.data() + 12, &past, 4);
    refused(far, "offset is past the end", 2);
    // Hostile bytes: random corruptions load or throw Error, never anything else.
    std::mt19937 rng(7);
    for (int trial = 0; trial < 3000; ++trial) {
        std::string bad = file;
        const int n_flips = 1 + int(rng() % 4);
        for (int k = 0; k < n_flips; ++k) bad[rng() % bad.size()] = char(rng());
        if (trial % 3 == 0) bad.resize(rng() % bad.size());
        for (size_t n_tasks : {size_t(0), size_t(2)}) {
            try {
                const auto got = multiple_choice_load(bad, "mc.bin", n_tasks);
                for (const auto& t : got) CHECK(t.answers.size() == t.labels.size());
            } catch (const Error&) {
            }
        }
    }
}

TEST_CASE("multiple choice on stories260K: the sensible answer of 2, 3 and 5 wins") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    BackendOptions bo;
    bo.kv_block_size = 16;
    bo.n_kv_blocks = 64;
    auto backend = make_cpu_backend(f, bo);
    const auto tasks = story_choice_tasks();
    std::vector<ChoiceTaskResult> results;
    const ChoiceScore s = multiple_choice_run(
        *backend, *tok, tasks, 512,
        [&](size_t, const ChoiceTaskResult& r, const ChoiceScore&) { results.push_back(r); });
    CHECK(s.n_correct == 3);
    CHECK(s.n_answers == 10);
    CHECK(s.acc == doctest::Approx(100.0));
    CHECK(s.chance == doctest::Approx(30.0));
    REQUIRE(results.size() == 3);
    CHECK(results[2].chosen == 4);
    CHECK(results[2].score.size() == 5);

    // The CLI: llama.cpp's table on stdout.
    kvrun::test::TempDir dir;
    const std::string path = dir.write("mc.bin", multiple_choice_file(tasks));
    auto r =
        kvrun::test::run_command(kvrun::test::kvrun_binary() + " perplexity -m " + model.string() +
                                 " --device cpu --multiple-choice -f " + path);
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out ==
          "task\tacc_norm\n1\t100.00000000\n2\t100.00000000\n3\t100.00000000\n"
          "Final result: 100.0000 +/- 0.0000\nRandom chance: 30.0000 +/- 32.4037\n");
}

TEST_CASE("Winogrande: llama.cpp's CSV, what is scored, and the CLI") {
    const std::string csv =
        "index,sentence,option1,option2,answer\n"
        "0,Lily had a red ball and Tom had a stick. _ threw the ball to the dog in the park.,"
        "Lily,Tom,1\n"
        "1,\"Once upon a time, there was a little _ named Lily. She loved to play.\",girl,table,"
        "1\r\n"
        "2,No blank here.,a,b,1\n"
        "3,The dog was happy because _ had a big bone to eat in the garden.,the dog,the moon,1\n"
        "4,Bad answer _ here.,a,b,3\n"
        "5,One day the sun was hot. The _ went to the park to play with her friends.,girl,rock,1";
    size_t skipped = 0;
    const auto tasks = winogrande_parse(csv, &skipped);
    CHECK(skipped == 3);  // the header, no blank, answer 3
    REQUIRE(tasks.size() == 4);
    CHECK(tasks[1].first == "Once upon a time, there was a little ");
    CHECK(tasks[1].second == " named Lily. She loved to play.");
    CHECK(tasks[1].choices[1] == "table");
    CHECK(tasks[3].answer == 1);
    CHECK(winogrande_select(tasks, 0).size() == 4);
    const auto two = winogrande_select(tasks, 2);
    REQUIRE(two.size() == 2);
    CHECK(two[0].first != two[1].first);

    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    GgufFile f = GgufFile::open(model.string());
    auto tok = Tokenizer::from_gguf(f);
    BackendOptions bo;
    bo.kv_block_size = 4;
    bo.n_kv_blocks = 64;
    auto backend = make_cpu_backend(f, bo);
    std::vector<WinograndeTaskResult> results;
    const WinograndeScore sc =
        winogrande_run(*backend, *tok, tasks, 7,
                       [&](size_t, const WinograndeTaskResult& r, const WinograndeScore&) {
                           results.push_back(r);
                       });
    CHECK(sc.n_tasks == 4);
    REQUIRE(results.size() == 4);
    // Task 1: the rest after the blank is long, so the choice itself is not scored; nor is
    // the final token.
    for (size_t c = 0; c < 2; ++c) {
        const auto t = tok->encode(tasks[1].first + tasks[1].choices[c] + tasks[1].second, true);
        const size_t base = tok->encode(tasks[1].first + tasks[1].choices[c], true).size();
        CHECK(results[1].score[c] ==
              doctest::Approx(plain_range_score(*backend, t, base, t.size() - 1)).epsilon(1e-5));
    }
    CHECK(results[1].chosen == (results[1].score[0] > results[1].score[1] ? 1 : 2));

    kvrun::test::TempDir dir;
    auto r =
        kvrun::test::run_command(kvrun::test::kvrun_binary() + " perplexity -m " + model.string() +
                                 " --device cpu --winogrande -f " + dir.write("wg.csv", csv));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find(fmt::format("Final Winogrande score(4 tasks): {:.4f} +/- {:.4f}", sc.acc,
                                 sc.sigma)) != std::string::npos);
    CHECK(r.err.find("3 lines that are not tasks skipped") != std::string::npos);
    auto none =
        kvrun::test::run_command(kvrun::test::kvrun_binary() + " perplexity -m " + model.string() +
                                 " --winogrande -f " + dir.write("none.csv", "a,b\n"));
    CHECK(none.exit_code == 1);
    CHECK(none.err.find("no Winogrande tasks (1 lines skipped)") != std::string::npos);
}

TEST_CASE("llama.cpp's --kl-divergence-base [--kl-divergence] spell --kld-save / --kld") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    auto text = kvrun::test::shared_path("text/wiki.test.raw");
    if (model.empty() || text.empty()) return;
    kvrun::test::TempDir dir;
    const std::string base = kvrun::test::kvrun_binary() + " perplexity --device cpu -c 128 " +
                             "--chunks 2 -f " + text.string() + " -m " + model.string() +
                             " --kl-divergence-base " + dir.file("b.kld");
    auto save = kvrun::test::run_command(base);
    CHECK_MESSAGE(save.exit_code == 0, save.err);
    CHECK(save.err.find("saved log-probabilities to") != std::string::npos);
    auto cmp = kvrun::test::run_command(base + " --kl-divergence --kv-type q8");
    CHECK_MESSAGE(cmp.exit_code == 0, cmp.err);
    CHECK(cmp.out.find("KL divergence vs " + dir.file("b.kld") + ": mean ") != std::string::npos);
    auto both = kvrun::test::run_command(base + " --kld " + dir.file("b.kld"));
    CHECK(both.exit_code == 1);
}

TEST_CASE("perplexity with -b holding several chunks: one pass each group, the same numbers") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string text =
        read_file_text((kvrun::test::shared_dir() / "text/wiki.test.raw").string());
    kvrun::test::TempDir dir;
    const PerplexityResult one = eval(model, text, 5, KvType::F16, dir.file("one.kld"));
    // -b 1024 with -c 256: four chunks per pass (5 chunks: a group of 4, then 1).
    const PerplexityResult four = eval(model, text, 5, KvType::F16, dir.file("four.kld"), {}, 1024);
    CHECK(four.ppl == one.ppl);
    CHECK(four.chunk_ppl == one.chunk_ppl);
    CHECK(read_file_text(dir.file("four.kld")) == read_file_text(dir.file("one.kld")));
    // -b 512 (two per pass) against the saved run: identical log-probabilities.
    const PerplexityResult two = eval(model, text, 5, KvType::F16, {}, dir.file("one.kld"), 512);
    CHECK(two.kld_max == 0.0);
    CHECK(two.top1_agreement == 1.0);
}
