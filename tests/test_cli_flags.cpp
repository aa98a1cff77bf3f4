// End-to-end tests of the kvrun executable, continued: the flags and JSON request fields
// beyond the basics (log-probabilities, logit bias, samplers, llama.cpp's spellings, RoPE,
// prompt caches, metadata overrides, stop strings).
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_test_util.h"
#include "test_util.h"

using kvrun::test::run_command;
using kvrun::test::shared_path;
using namespace kvrun::test::cli;

TEST_CASE("--n-probs / JSON \"n_probs\": each token's logprob and the most likely alternatives") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    auto r = run_command(kvrun_cmd("run" + m + " -p 'Once upon a time' --temp 0 -n 4 --n-probs 3"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out == ", there was a\n");  // stdout keeps only the text
    CHECK(r.err.find("--- logprobs") != std::string::npos);
    CHECK(r.err.find("\",\"  -0.0317  96.9% | \",\" 96.9% \" there\" 2.9%") != std::string::npos);

    const std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 3, \"temperature\": 0, \"n_probs\": 2}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 3, \"temperature\": 0}\n"
        "{\"prompt\": \"hi\", \"n_probs\": 101}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m), input);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    std::string line;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 3);
    REQUIRE(res[0]["logprobs"].size() == 3);
    const auto& first = res[0]["logprobs"][0];
    CHECK(first["id"] == res[0]["tokens"][0]);
    CHECK(first["token"] == ",");
    CHECK(first["bytes"] == nlohmann::json({44}));
    CHECK(first["logprob"].get<double>() == doctest::Approx(-0.03175).epsilon(1e-3));
    REQUIRE(first["top_logprobs"].size() == 2);
    CHECK(first["top_logprobs"][1]["token"] == " there");
    CHECK_FALSE(res[1].contains("logprobs"));  // only when asked
    CHECK(res[2]["error"] == "'n_probs' must be between 0 and 100 (got 101)");
    check_one_clear_error(run_command(kvrun_cmd("run" + m + " -p hi --n-probs 101")), "--n-probs");

    const std::string prompts = temp_file("Once upon a time\nThe dog\n", "nprobs");
    auto b = run_command(kvrun_cmd("batch" + m + " -f " + prompts + " --temp 0 -n 3 --n-probs 1"));
    CHECK_MESSAGE(b.exit_code == 0, b.err);
    std::istringstream bin(b.out);
    int n = 0;
    while (std::getline(bin, line)) {
        auto x = nlohmann::json::parse(line);
        CHECK(x["logprobs"].size() == x["tokens"].size());
        CHECK(x["logprobs"][0]["top_logprobs"].size() == 1);
        ++n;
    }
    CHECK(n == 2);
}

TEST_CASE("-l/--logit-bias and JSON \"logit_bias\" (object or pairs) change the output") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string base = "run" + m + " -p 'Once upon a time' --temp 0 -n 4";
    CHECK(run_command(kvrun_cmd(base)).out == ", there was a\n");
    // 432 is ",", 383 is " there".
    auto r = run_command(kvrun_cmd(base + " -l 432-inf --logit-bias 383+5"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out == " there there was a\n");
    check_one_clear_error(run_command(kvrun_cmd(base + " -l 432")), "bad logit bias '432'");
    check_one_clear_error(run_command(kvrun_cmd(base + " -l 432+inf")), "--logit-bias");
    check_one_clear_error(run_command(kvrun_cmd(base + " -l 99999+1")),
                          "logit bias: token id 99999 is outside the vocabulary (0..511)");

    const std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0, "
        "\"logit_bias\": {\"432\": -1000, \"383\": 5}}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0, "
        "\"logit_bias\": [[432, false], [383, 5]]}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"temperature\": 0, "
        "\"logit_bias\": []}\n"
        "{\"prompt\": \"hi\", \"logit_bias\": {\"abc\": 1}}\n"
        "{\"prompt\": \"hi\", \"logit_bias\": [[1, \"x\"]]}\n"
        "{\"prompt\": \"hi\", \"logit_bias\": {\"600\": 1}}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m + " -l 410+100"), input);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    std::string line;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 6);
    CHECK(res[0]["text"] == " there there was a");  // the request's biases replace -l's
    CHECK(res[1]["text"] == " there there was a");
    CHECK(res[2]["text"] == ", there was a");  // [] clears the command line's
    CHECK(res[3]["error"] == "'logit_bias': 'abc' is not a token id");
    CHECK(res[4]["error"].get<std::string>().find("'logit_bias' must be") == 0);
    CHECK(res[5]["error"] == "logit bias: token id 600 is outside the vocabulary (0..511)");
}

TEST_CASE("--special / -sp shows generated control tokens; -np is --parallel") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    // Token 1 is the control token <s>: forced by a bias, it is invisible unless --special.
    const std::string base = "run" + m + " -p 'Once' --temp 0 -n 3 -l 1+100";
    CHECK(run_command(kvrun_cmd(base)).out == "\n");
    CHECK(run_command(kvrun_cmd(base + " --special")).out == "<s><s><s>\n");
    CHECK(run_command(kvrun_cmd(base + " -sp --n-samples 2")).out.find("<s><s><s>\n") !=
          std::string::npos);
    const std::string req = "{\"prompt\": \"Once\", \"n_predict\": 2}\n";
    auto j = run_command(kvrun_cmd("run --jsonl -sp -l 1+100" + m), req);
    CHECK(nlohmann::json::parse(j.out)["text"] == "<s><s>");
    kvrun::test::TempDir dir;
    const std::string prompts = dir.file("p.txt");
    std::ofstream(prompts) << "Once\nThe dog\n";
    auto b = run_command(kvrun_cmd("batch -f " + prompts + m + " -n 2 -l 1+100 -np 2 --special"));
    CHECK_MESSAGE(b.exit_code == 0, b.err);
    CHECK(b.out.find("\"text\":\"<s><s>\"") != std::string::npos);
    b = run_command(kvrun_cmd("batch -f " + prompts + m + " -n 2 -l 1+100"));
    CHECK(b.out.find("\"text\":\"\"") != std::string::npos);
}

TEST_CASE("DRY, XTC, typical, top-n-sigma, dynamic temperature, mirostat: flags and JSON agree") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string base = "run" + m + " -p 'Once upon a time' --temp 0 -n 250";
    const auto plain = run_command(kvrun_cmd(base));
    const auto dry = run_command(kvrun_cmd(base + " --dry-multiplier 0.8"));
    CHECK_MESSAGE(dry.exit_code == 0, dry.err);
    CHECK(dry.out != plain.out);  // the greedy story repeats "was sad and didn't know what to do"
    auto count = [](const std::string& text) {
        int n = 0;
        for (size_t at = 0;
             (at = text.find("was sad and didn't know what to do", at)) != std::string::npos; ++at)
            ++n;
        return n;
    };
    CHECK(count(plain.out) == 2);
    CHECK(count(dry.out) == 1);
    // The defaults spelled out, with escapes, give the same; no breakers give another text.
    const auto spelled =
        run_command(kvrun_cmd(base + " --dry-multiplier 0.8 --dry-sequence-breaker '\\n' "
                                     "--dry-sequence-breaker : --dry-sequence-breaker '\"' "
                                     "--dry-sequence-breaker '*'"));
    CHECK(spelled.out == dry.out);
    const auto none =
        run_command(kvrun_cmd(base + " --dry-multiplier 0.8 --dry-sequence-breaker none"));
    CHECK(none.out != dry.out);

    const std::string req =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 250, "
        "\"temperature\": 0";
    const std::string input = req + ", \"dry_multiplier\": 0.8}\n" + req +
                              ", \"dry_multiplier\": 0.8, \"dry_sequence_breakers\": []}\n" + req +
                              "}\n" + "{\"prompt\": \"hi\", \"typical_p\": 2}\n" +
                              "{\"prompt\": \"hi\", \"dry_sequence_breakers\": \"abc\"}\n" +
                              // mirostat with tau 0 keeps only the best token: greedy
                              "{\"prompt\": \"Once upon a time\", \"n_predict\": 250, "
                              "\"temperature\": 1, \"mirostat\": 2, \"mirostat_tau\": 0}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m), input);
    std::istringstream jin(j.out);
    std::vector<nlohmann::json> res;
    std::string line;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 6);
    CHECK(res[0]["text"].get<std::string>() + "\n" == dry.out);
    CHECK(res[1]["text"].get<std::string>() + "\n" == none.out);
    CHECK(res[2]["text"].get<std::string>() + "\n" == plain.out);
    CHECK(res[3]["error"] == "typical-p must be between 0 and 1 (got 2; 1 disables it)");
    CHECK(res[4].contains("error"));
    CHECK(res[5]["text"].get<std::string>() + "\n" == plain.out);

    // Sampled with every extra at once: a seed gives one text, the flags change it.
    const std::string sampled = "run" + m + " -p 'Once upon a time' -n 60 --temp 1 -s 4";
    const std::string extras =
        " --xtc-probability 0.5 --xtc-threshold 0.1 --typical 0.9 --top-nsigma 2 "
        "--dynatemp-range 0.5 --dynatemp-exp 2 --dry-multiplier 1";
    const auto a = run_command(kvrun_cmd(sampled + extras));
    const auto b = run_command(kvrun_cmd(sampled + extras));
    CHECK_MESSAGE(a.exit_code == 0, a.err);
    CHECK(a.out == b.out);
    CHECK(a.out != run_command(kvrun_cmd(sampled)).out);
    // batch takes the same flags.
    auto bt = run_command(kvrun_cmd("batch" + m +
                                    " -f /dev/stdin --format txt -n 250 --temp 0 "
                                    "--dry-multiplier 0.8"),
                          "Once upon a time\n");
    CHECK_MESSAGE(bt.exit_code == 0, bt.err);
    REQUIRE(!bt.out.empty());
    CHECK(nlohmann::json::parse(bt.out)["text"].get<std::string>() + "\n" == dry.out);
}

TEST_CASE("llama.cpp's spellings: -ngl, --ctx-size, -ctk/-ctv, -md/--draft-max, -s -1, -e") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    const std::string base = "run" + m + " -p 'Once upon a time' -n 12 --temp 0";
    const auto plain = run_command(kvrun_cmd(base));
    auto r = run_command(kvrun_cmd(base + " -ngl 0 --ctx-size 128 -ctk q8_0 -ctv q4_0 --stats"));
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("(cpu)") != std::string::npos);
    CHECK(r.err.find("K q8, V q4") != std::string::npos);
    CHECK(r.err.find("8 blocks of 16 tokens") != std::string::npos);  // 128 tokens
    const auto draft = shared_path("models/stories260K-Q8_0.gguf");
    auto d = run_command(
        kvrun_cmd(base + " -md " + draft.string() + " --draft-max 4 --draft-p-min 0.5 --stats"));
    CHECK_MESSAGE(d.exit_code == 0, d.err);
    CHECK(d.out == plain.out);
    CHECK(d.err.find("speculative with") != std::string::npos);
    // -e/--escape: \n in the prompt is a newline (without it, a backslash and an n).
    const std::string esc = "run" + m + " -p 'Hello\\nWorld' --echo -n 2 --temp 0";
    CHECK(run_command(kvrun_cmd(esc + " -e")).out.rfind("Hello\nWorld", 0) == 0);
    CHECK(run_command(kvrun_cmd(esc)).out.rfind("Hello\\nWorld", 0) == 0);
    // -s -1: a random seed each time.
    std::set<std::string> outs;
    for (int i = 0; i < 3; ++i)
        outs.insert(
            run_command(kvrun_cmd("run" + m + " -p 'Once upon a time' -n 40 --temp 1.5 -s -1"))
                .out);
    CHECK(outs.size() >= 2);
    const std::string input =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 4, \"seed\": -1}\n"
        "{\"prompt\": \"hi\", \"seed\": -5}\n";
    auto j = run_command(kvrun_cmd("run --jsonl" + m), input);
    std::istringstream jin(j.out);
    std::string line;
    std::vector<nlohmann::json> res;
    while (std::getline(jin, line)) res.push_back(nlohmann::json::parse(line));
    REQUIRE(res.size() == 2);
    CHECK(res[0].contains("text"));
    CHECK(res[1]["error"] == "'seed' must be a count >= 0 or -1 for a random one (got -5)");

    // -tb, -ub, --no-mmap, --mlock, -fa: the same tokens (-ub 3 prefills in passes of 3 tokens,
    // -tb 2 uses two threads for them and -t 1 one for each decode step).
    for (const char* flags :
         {" -t 1 -tb 2", " -ub 3", " -b 8 -ub 16", " --no-mmap", " --mlock", " --no-mmap --mlock",
          " -fa", " -fa on", " --flash-attn auto", " --no-warmup"}) {
        CAPTURE(flags);
        auto x = run_command(kvrun_cmd(base + flags));
        CHECK_MESSAGE(x.exit_code == 0, x.err);
        CHECK(x.out == plain.out);
    }
    // --verbose-prompt: the prompt's tokens on stderr; --no-display-prompt (the default) wins
    // over --echo.
    auto vp = run_command(kvrun_cmd(base + " --verbose-prompt --echo --no-display-prompt"));
    CHECK(vp.out == plain.out);
    CHECK(vp.err.find("prompt: 'Once upon a time'\nnumber of tokens in prompt = 5\n       1 -> "
                      "'<s>'\n     403 -> ' Once'\n") != std::string::npos);
    auto fa_off = run_command(kvrun_cmd(base + " -fa off"));
    CHECK(fa_off.out == plain.out);
    CHECK(fa_off.err.find("-fa off changes nothing") != std::string::npos);
    check_bad_run_flags({{"-ub 0", "--ubatch-size"},
                         {"-tb -1", "--threads-batch"},
                         {"-fa maybe", "--flash-attn"},
                         {"--draft-p-min 2", "--draft-p-min"}});
}

TEST_CASE("RoPE flags: --rope-scale, --rope-freq-base, --rope-scaling, --yarn-*") {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"--rope-scaling dynamic", "--rope-scaling"},
        {"--rope-scale 0", "--rope-scale"},
        {"--rope-freq-base -1", "--rope-freq-base"},
        {"--rope-freq-scale nan", "--rope-freq-scale"},
        {"--yarn-orig-ctx 0", "--yarn-orig-ctx: must be at least 1 (got 0)"},
        {"--yarn-beta-fast 0", "--yarn-beta-fast"},
    };
    check_bad_run_flags(bad);
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string base =
        "run -m " + model.string() + " -p 'Once upon a time, there was a' -n 40 --temp 0";
    const auto plain = run_command(kvrun_cmd(base));
    REQUIRE(plain.exit_code == 0);
    // The model's own values restate nothing.
    CHECK(run_command(kvrun_cmd(base + " --rope-freq-base 10000 --rope-scale 1")).out == plain.out);
    const auto x4 = run_command(kvrun_cmd(base + " --rope-scale 4"));
    CHECK_MESSAGE(x4.exit_code == 0, x4.err);
    CHECK(x4.out != plain.out);
    CHECK(run_command(kvrun_cmd(base + " --rope-freq-scale 0.25 --rope-scaling linear")).out ==
          x4.out);
    const auto yarn =
        run_command(kvrun_cmd(base + " --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 128"));
    CHECK_MESSAGE(yarn.exit_code == 0, yarn.err);
    CHECK(yarn.out != x4.out);
    CHECK(yarn.out != plain.out);
    // The flags reach every model-running mode.
    auto chat = run_command(kvrun_cmd("chat -m " + model.string() +
                                      " --temp 0 -n 8 --rope-scale 2 --chat-template plain"),
                            "hi\n");
    CHECK_MESSAGE(chat.exit_code == 0, chat.err);
    auto info = run_command(kvrun_cmd("info --json -m " + model.string()));
    CHECK(nlohmann::json::parse(info.out)["hyperparameters"]["rope_scaling"] == "none");
}

TEST_CASE("--prompt-cache: a second run reuses the prompt's blocks and prints the same text") {
    check_bad_run_flags({{"--prompt-cache-ro", "--prompt-cache-ro requires --prompt-cache"}});
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    kvrun::test::TempDir dir;
    const std::string cache = dir.file("prompt.cache");
    const std::string base = "run -m " + model.string() +
                             " -p 'Once upon a time, there was a little girl named Lily. She "
                             "loved to play outside in the park with her friends.' -n 20 "
                             "--temp 0 --stats --prompt-cache " +
                             cache;
    const auto first = run_command(kvrun_cmd(base));
    REQUIRE_MESSAGE(first.exit_code == 0, first.err);
    CHECK(first.err.find("prompt cache      " + cache + ": new, 2 blocks saved") !=
          std::string::npos);
    const auto second = run_command(kvrun_cmd(base));
    REQUIRE_MESSAGE(second.exit_code == 0, second.err);
    CHECK(second.out == first.out);
    CHECK(second.err.find("2 of 2 blocks loaded (32 tokens)") != std::string::npos);
    CHECK(second.err.find("32 from the prefix cache") != std::string::npos);
    // -ro: used, never written; another KV format: a note, the run goes on.
    const auto ro = run_command(kvrun_cmd(base + " --prompt-cache-ro --kv-type q8"));
    CHECK(ro.exit_code == 0);
    CHECK(ro.err.find("kvrun: note: prompt cache " + cache +
                      " is not used: it was made with another KV cache") != std::string::npos);
    CHECK(run_command(kvrun_cmd(base)).err.find("2 of 2 blocks loaded") != std::string::npos);
    // --prompt-cache-all keeps the generated tokens' blocks too.
    const auto all = run_command(kvrun_cmd(base + " --prompt-cache-all"));
    CHECK(all.err.find("3 blocks saved") != std::string::npos);
    // A corrupt file: one clear line, exit 1.
    std::string bytes = read_all(cache);
    bytes[bytes.size() / 2] ^= 1;
    const std::string bad = dir.write("bad.cache", bytes);
    check_one_clear_error(
        run_command(kvrun_cmd("run -m " + model.string() + " -p hi -n 2 --prompt-cache " + bad)),
        "prompt cache is corrupt (checksum mismatch)");
    // batch and run --jsonl take it too.
    const std::string prompts = dir.write(
        "p.txt",
        "Once upon a time, there was a little girl named Lily. She loved to play outside\n");
    const std::string b = "batch -m " + model.string() + " -f " + prompts +
                          " -n 4 --temp 0 --no-progress --prompt-cache " + dir.file("b.cache");
    CHECK(run_command(kvrun_cmd(b)).err.find("new, 1 blocks saved") != std::string::npos);
    CHECK(run_command(kvrun_cmd(b)).err.find("1 of 1 blocks loaded") != std::string::npos);
    const auto j = run_command(
        kvrun_cmd("run --jsonl --stats -m " + model.string() + " --prompt-cache " + cache),
        "{\"prompt\": \"Once upon a time, there was a little girl named Lily. She loved to "
        "play outside in the park with her friends.\", \"n_predict\": 2}\n");
    CHECK(j.err.find("blocks loaded") != std::string::npos);
}

TEST_CASE("--override-kv KEY=TYPE:VALUE replaces metadata before the model loads") {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"--override-kv foo", "bad override 'foo' (expected KEY=TYPE:VALUE"},
        {"--override-kv =int:1", "bad override '=int:1'"},
        {"--override-kv a=long:1", "bad override 'a=long:1'"},
        {"--override-kv a=int:1.5", "'1.5' is not an integer"},
        {"--override-kv a=float:nan", "'nan' is not a finite number"},
        {"--override-kv a=bool:yes", "a bool is true or false"},
    };
    check_bad_run_flags(bad);
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string m = " -m " + model.string();
    // No BOS: the prompt is one token shorter.
    auto ids = [&](const std::string& extra) {
        auto r = run_command(kvrun_cmd("run --jsonl" + m + extra),
                             "{\"prompt\": \"Once upon a time\", \"n_predict\": 1}\n");
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        return nlohmann::json::parse(r.out)["prompt_tokens"].size();
    };
    CHECK(ids(" --override-kv tokenizer.ggml.add_bos_token=bool:false") + 1 == ids(""));
    // A RoPE base in the metadata equals the flag, and differs from the model's own.
    const std::string base = "run" + m + " -p 'Once upon a time, there was a' -n 30 --temp 0";
    const auto flag = run_command(kvrun_cmd(base + " --rope-freq-base 300"));
    const auto kv = run_command(kvrun_cmd(base + " --override-kv llama.rope.freq_base=float:300"));
    CHECK_MESSAGE(kv.exit_code == 0, kv.err);
    CHECK(kv.out == flag.out);
    CHECK(kv.out != run_command(kvrun_cmd(base)).out);
    // An override the loader refuses is reported like a bad file.
    check_one_clear_error(run_command(kvrun_cmd(base + " --override-kv llama.block_count=int:-3")),
                          "llama.block_count");
}

TEST_CASE("--samplers / --sampling-seq and JSON \"samplers\": llama.cpp's filter order") {
    check_bad_run_flags({{"--samplers top_z", "unknown sampler 'top_z'"},
                         {"--sampling-seq kk", "sampler 'top_k' is listed twice"}});
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string base =
        "run -m " + model.string() + " -p 'Once upon a time' -n 40 --temp 3 --top-p 0.5 -s 5";
    const auto plain = run_command(kvrun_cmd(base));
    const auto flag = run_command(kvrun_cmd(base + " --samplers 'temperature;top_p'"));
    const auto seq = run_command(kvrun_cmd(base + " --sampling-seq tp"));
    CHECK_MESSAGE(flag.exit_code == 0, flag.err);
    CHECK(flag.out == seq.out);
    CHECK(flag.out != plain.out);  // top-p on the tempered distribution keeps more tokens
    // The default order spelled out changes nothing.
    CHECK(run_command(kvrun_cmd(base + " --sampling-seq edskypmxt")).out == plain.out);
    auto j = run_command(kvrun_cmd("run --jsonl -m " + model.string()),
                         "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, \"temperature\": "
                         "3, \"top_p\": 0.5, \"seed\": 5, \"samplers\": [\"temperature\", "
                         "\"top_p\"]}\n"
                         "{\"prompt\": \"hi\", \"samplers\": \"top_k;nope\"}\n");
    const std::vector<nlohmann::json> lines = json_lines(j.out);
    REQUIRE(lines.size() == 2);
    CHECK(flag.out.find(lines[0]["text"].get<std::string>()) != std::string::npos);
    CHECK(lines[1]["error"].get<std::string>().find("unknown sampler 'nope'") != std::string::npos);
}

TEST_CASE("run --jsonl and batch report the stop string that ended a text (stopping_word)") {
    auto model = shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string req =
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 40, \"temperature\": 0, "
        "\"stop\": [\"zzz\", \"Lily\", \"girl\"]}\n"
        "{\"prompt\": \"Once upon a time\", \"n_predict\": 3, \"temperature\": 0, "
        "\"stop\": [\"zzz\"]}\n";
    auto r = run_command(kvrun_cmd("run --jsonl -m " + model.string()), req);
    CHECK(r.exit_code == 0);
    const std::vector<nlohmann::json> lines = json_lines(r.out);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0]["stop"] == "stop");
    CHECK(lines[0]["stopping_word"] == "girl");  // before "Lily" in the text
    // The text ends before it (the tokens still hold it).
    const std::string text = lines[0]["text"];
    CHECK(text.find("girl") == std::string::npos);
    CHECK(text.find("Lily") == std::string::npos);
    const auto toks = lines[0]["tokens"].get<std::vector<int>>();
    CHECK_FALSE(toks.empty());
    CHECK_FALSE(lines[1].contains("stopping_word"));
    const std::string in = temp_file(req, "stops.jsonl");
    auto b = run_command(kvrun_cmd("batch --format jsonl -m " + model.string() + " -f " + in));
    CHECK(json_lines(b.out)[0]["stopping_word"] == "girl");
}
