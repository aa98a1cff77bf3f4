// Fill in the middle (infill.h): the prompt's layout in both orders, extra files, fitting a
// long prefix and suffix into the context (the text nearest the cursor kept), clear errors;
// and the server's /infill and OpenAI "suffix", which must generate exactly what the engine
// generates alone for that prompt. stories260K has no FIM tokens, so three of its byte
// tokens are named FIM tokens through --override-kv.
#include <doctest/doctest.h>

#include "infill.h"
#include "server_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

namespace {

constexpr TokenId kPre = 3, kSuf = 4, kMid = 5, kSep = 6;

std::vector<std::string> fim_overrides(bool with_sep) {
    std::vector<std::string> o = {"tokenizer.ggml.fim_pre_token_id=int:3",
                                  "tokenizer.ggml.fim_suf_token_id=int:4",
                                  "tokenizer.ggml.fim_mid_token_id=int:5"};
    if (with_sep) o.push_back("tokenizer.ggml.fim_sep_token_id=int:6");
    return o;
}

std::vector<TokenId> cat(std::initializer_list<std::vector<TokenId>> parts) {
    std::vector<TokenId> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

}  // namespace

TEST_CASE("infill: prompt layout, extra files, fitting the context, errors") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served plain(path, 512, 1);
    CHECK(!infill_supported(*plain.m.tokenizer));
    try {
        infill_prompt(*plain.m.tokenizer, {}, 0);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("no fill-in-the-middle tokens") != std::string::npos);
    }

    Served s(path, 512, 1, 0, fim_overrides(false));
    const Tokenizer& tok = *s.m.tokenizer;
    REQUIRE(infill_supported(tok));
    CHECK(tok.fim().pre == kPre);
    CHECK(tok.fim().sep == -1);
    auto enc = [&](const std::string& t) { return tok.encode(t, false, false); };
    const std::vector<TokenId> bos =
        tok.add_bos() ? std::vector<TokenId>{tok.bos()} : std::vector<TokenId>{};

    InfillInput in;
    in.prefix = "Once upon a time, there was a";
    in.suffix = " The end.";
    in.prompt = " little";
    InfillPrompt p = infill_prompt(tok, in, 0);
    CHECK(!p.truncated);
    CHECK(p.tokens ==
          cat({bos, {kPre}, enc(in.prefix), {kSuf}, enc(in.suffix), {kMid}, enc(in.prompt)}));
    in.spm = true;
    CHECK(infill_prompt(tok, in, 0).tokens ==
          cat({bos, {kSuf}, enc(in.suffix), {kPre}, enc(in.prefix), {kMid}, enc(in.prompt)}));
    in.spm = false;

    // Extra files: plain text before the rest without a SEP token, SEP + name with one.
    in.extra = {{"a.txt", "Tom had a dog."}, {"b.txt", "It was red.\n"}};
    CHECK(infill_prompt(tok, in, 0).tokens == cat({bos,
                                                   enc("Tom had a dog.\n"),
                                                   enc("It was red.\n"),
                                                   {kPre},
                                                   enc(in.prefix),
                                                   {kSuf},
                                                   enc(in.suffix),
                                                   {kMid},
                                                   enc(in.prompt)}));
    Served sep(path, 512, 1, 0, fim_overrides(true));
    const Tokenizer& tok2 = *sep.m.tokenizer;
    CHECK(infill_prompt(tok2, in, 0).tokens == cat({bos,
                                                    {kSep},
                                                    enc("a.txt\n"),
                                                    enc("Tom had a dog."),
                                                    {kSep},
                                                    enc("b.txt\n"),
                                                    enc("It was red.\n"),
                                                    {kPre},
                                                    enc(in.prefix),
                                                    {kSuf},
                                                    enc(in.suffix),
                                                    {kMid},
                                                    enc(in.prompt)}));

    // Too long: the prefix keeps its end, the suffix its start (at most a quarter of the room
    // beside the special tokens and the prompt); extra files go first.
    in.prefix.clear();
    in.suffix.clear();
    for (int i = 0; i < 40; ++i) in.prefix += " The cat sat.";
    for (int i = 0; i < 40; ++i) in.suffix += " A dog ran.";
    const std::vector<TokenId> pre = enc(in.prefix), suf = enc(in.suffix), pr = enc(in.prompt);
    const int64_t budget = 200;
    p = infill_prompt(tok, in, budget);
    CHECK(p.truncated);
    CHECK(static_cast<int64_t>(p.tokens.size()) == budget);
    const int64_t room = budget - int64_t(bos.size()) - 3 - int64_t(pr.size());
    const int64_t n_suf = room / 4, n_pre = room - n_suf;
    CHECK(p.tokens == cat({bos,
                           {kPre},
                           std::vector<TokenId>(pre.end() - n_pre, pre.end()),
                           {kSuf},
                           std::vector<TokenId>(suf.begin(), suf.begin() + n_suf),
                           {kMid},
                           pr}));
    // A short prefix leaves its room to the suffix.
    in.prefix = "Hi.";
    p = infill_prompt(tok, in, budget);
    CHECK(static_cast<int64_t>(p.tokens.size()) == budget);
    CHECK(p.tokens ==
          cat({bos,
               {kPre},
               enc("Hi."),
               {kSuf},
               std::vector<TokenId>(suf.begin(), suf.begin() + (room - int64_t(enc("Hi.").size()))),
               {kMid},
               pr}));
    in.extra.clear();
    in.prompt = std::string(300, 'x');
    try {
        infill_prompt(tok, in, budget);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("leaves no room") != std::string::npos);
    }
}

TEST_CASE("server: /infill and OpenAI's suffix generate what the engine does for the FIM prompt") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, 512, 2, 0, fim_overrides(false));
    const Tokenizer& tok = *s.m.tokenizer;
    InfillInput in;
    in.prefix = "Lily went to the";
    in.suffix = " She was happy.";
    in.prompt = " park";
    const std::vector<TokenId> prompt = infill_prompt(tok, in, 0).tokens;
    const std::string expected = s.reference(prompt, 20);
    in.prompt.clear();
    const std::string expected_no_prompt = s.reference(infill_prompt(tok, in, 0).tokens, 20);
    Running run(s.config(), s);

    const json body = {{"input_prefix", "Lily went to the"},
                       {"input_suffix", " She was happy."},
                       {"prompt", " park"},
                       {"n_predict", 20},
                       {"temperature", 0}};
    HttpReply r = run.post("/infill", body);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    json j = json::parse(r.body);
    CHECK(j["content"] == expected);
    CHECK(j["tokens_evaluated"] == prompt.size());
    CHECK(j["truncated"] == false);

    // Streamed: the chunks add up to the same.
    json sb = body;
    sb["stream"] = true;
    r = run.post("/infill", sb);
    REQUIRE(r.status == 200);
    std::string streamed;
    for (const std::string& e : sse_data(r.body)) streamed += json::parse(e)["content"];
    CHECK(streamed == expected);

    // OpenAI's suffix: the prompt is the prefix.
    r = run.post("/v1/completions", {{"prompt", "Lily went to the"},
                                     {"suffix", " She was happy."},
                                     {"max_tokens", 20},
                                     {"temperature", 0}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(json::parse(r.body)["choices"][0]["text"] == expected_no_prompt);

    // A prefix far longer than the context is cut to fit, and says so.
    std::string long_prefix;
    for (int i = 0; i < 200; ++i) long_prefix += " The cat sat on the mat.";
    r = run.post("/infill", {{"input_prefix", long_prefix}, {"n_predict", 8}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    j = json::parse(r.body);
    CHECK(j["truncated"] == true);
    CHECK(j["tokens_evaluated"].get<int64_t>() <= 512 - 8);

    // Bad requests.
    struct Bad {
        std::string path;
        json body;
        std::string message;
    };
    const std::vector<Bad> bad = {
        {"/infill", {{"input_prefix", 5}}, "bad field type"},
        {"/infill", {{"input_extra", "x"}}, "'input_extra'"},
        {"/completion", {{"prompt", "x"}, {"suffix", "y"}}, "'suffix' is for /v1/completions"},
        {"/v1/completions", {{"prompt", {1, 2}}, {"suffix", "y"}}, "needs a text 'prompt'"},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.body.dump());
        const HttpReply e = run.post(b.path, b.body);
        CHECK(e.status == 400);
        CHECK_MESSAGE(e.body.find(b.message) != std::string::npos, e.body);
    }
}

TEST_CASE(
    "server: what llama.vim and llama.vscode send: response_fields, n_indent, t_max_predict_ms") {
    // Code-completion clients ask for a few fields back and bound the reply by time and by
    // indentation; a grammar makes the model write lines of known indentation.
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, 512, 2, 0, fim_overrides(false));
    Running run(s.config(), s);
    const json base = {{"input_prefix", "def f(x):\n"},
                       {"input_suffix", "\n"},
                       {"n_predict", 40},
                       {"temperature", 0},
                       {"ignore_eos", true},
                       {"grammar", R"(root ::= "    a\n  b\nc" [a-z]+)"}};
    auto infill = [&](json extra) {
        json body = base;
        body.update(extra);
        const HttpReply r = run.post("/infill", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        return json::parse(r.body);
    };
    const json whole = infill(json::object());
    REQUIRE(whole["content"].get<std::string>().starts_with("    a\n  b\nc"));
    // response_fields: only those, a path's value under the path's name; unknown ones left out.
    const json picked =
        infill({{"response_fields", {"content", "timings/predicted_n", "truncated", "no/such"}}});
    CHECK(picked == json{{"content", whole["content"]},
                         {"timings/predicted_n", whole["timings"]["predicted_n"]},
                         {"truncated", false}});
    // n_indent 4: the line "  b" is indented less: the reply ends at its "b" (stop "limit"),
    // keeping the blanks before it, as llama-server does.
    const json indent = infill({{"n_indent", 4}});
    CHECK(indent["content"] == "    a\n  ");
    CHECK(indent["stop_type"] == "limit");
    // t_max_predict_ms: past it, the reply ends at its first newline.
    const json timed = infill({{"t_max_predict_ms", 0.000001}});
    CHECK(timed["content"] == "    a\n");
    CHECK(infill({{"t_max_predict_ms", 60000}})["content"] == whole["content"]);
    for (const json& bad : {json{{"n_indent", -1}}, json{{"t_max_predict_ms", "soon"}},
                            json{{"response_fields", "content"}}}) {
        json body = base;
        body.update(bad);
        CHECK_MESSAGE(run.post("/infill", body).status == 400, bad.dump());
    }
    CHECK(run.post("/v1/completions", {{"prompt", "x"}, {"response_fields", {"content"}}}).status ==
          400);
}

TEST_CASE("server: /infill on a model without FIM tokens is one clear 400") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path, 512, 1);
    Running run(s.config(), s);
    const HttpReply r = run.post("/infill", {{"input_prefix", "a"}, {"input_suffix", "b"}});
    CHECK(r.status == 400);
    CHECK(r.body.find("no fill-in-the-middle tokens") != std::string::npos);
}
