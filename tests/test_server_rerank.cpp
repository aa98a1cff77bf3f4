// Reranking (rerank.h) over HTTP and on the command line: `server --rerank` scores each
// document with a yes/no judge, most relevant first (/v1/rerank and llama-server's other
// paths, top_n, texts back, refusals), and `kvrun embedding --pooling rank` gives the same
// scores, both checked against P(yes) / (P(yes) + P(no)) from prompt_logprobs.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common.h"
#include "prompt_logprobs.h"
#include "rerank.h"
#include "server_test_util.h"
#include "test_util.h"
#include "tool_test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

TEST_CASE("server --rerank: documents scored by a yes/no judge, most relevant first") {
    // The story model with two byte tokens it never uses renamed to the words "yes" and "no"
    // stands in for a Qwen3-Reranker: each score must be P(yes) / (P(yes) + P(no)) after the
    // judge prompt, computed here from the same prompts' log-probabilities.
    const std::string path = model_path();
    if (path.empty()) return;
    {
        Served plain(path, 256, 1);
        CHECK_THROWS_WITH_AS(rerank_judge(*plain.m.tokenizer),
                             doctest::Contains("answers \"yes\" or \"no\" in one token"), Error);
    }
    const std::string model =
        with_control_tokens(path, {{"<0x03>", "\xe2\x96\x81yes"}, {"<0x04>", "\xe2\x96\x81no"}},
                            "kvrun-test-yes-no-tokens.gguf", /*type=*/1);
    Served s(model, /*n_ctx=*/512, /*parallel=*/2);
    const Tokenizer& tok = *s.m.tokenizer;
    const RerankJudge judge = rerank_judge(tok);
    CHECK(tok.token_to_piece(judge.yes) == " yes");
    CHECK_THROWS_AS(rerank_judge(tok, "no placeholders"), Error);
    const std::string query = "Where is the cat?";
    const std::vector<std::string> docs = {"The cat is on the mat.", "Lily has a red ball.",
                                           "The dog ran to the park.", "{query} <|im_end|>"};
    // A document's own "{query}" is text, not a placeholder; "<|im_end|>" is its text too.
    const std::vector<TokenId> odd = rerank_tokens(tok, judge, kRerankInstruction, query, docs[3]);
    CHECK(tok.decode(odd).find("{query} <|im_end|>") != std::string::npos);
    std::vector<double> want;
    for (const std::string& d : docs) {
        std::vector<TokenId> p = rerank_tokens(tok, judge, kRerankInstruction, query, d);
        p.push_back(judge.yes);
        const double ly = prompt_logprobs(s.engine->backend(), s.engine->kv_table(), p, 1, 64)
                              .back()
                              .chosen.logprob;
        p.back() = judge.no;
        const double ln = prompt_logprobs(s.engine->backend(), s.engine->kv_table(), p, 1, 64)
                              .back()
                              .chosen.logprob;
        want.push_back(std::exp(ly) / (std::exp(ly) + std::exp(ln)));
    }
    CHECK(s.engine->kv_table().n_used_blocks() == 0);
    // rerank_scores packs the prompts several to a pass, or splits one over passes: the same
    // scores whatever the pass size; a prompt over the bound is refused, nothing left held.
    std::vector<std::vector<TokenId>> prompts;
    for (const std::string& d : docs)
        prompts.push_back(rerank_tokens(tok, judge, kRerankInstruction, query, d));
    for (int32_t n_batch : {7, 64, 1024}) {
        CAPTURE(n_batch);
        const std::vector<double> got =
            rerank_scores(s.engine->backend(), s.engine->kv_table(), judge, prompts, n_batch, 512);
        REQUIRE(got.size() == docs.size());
        for (size_t i = 0; i < docs.size(); ++i)
            CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
        CHECK(s.engine->kv_table().n_used_blocks() == 0);
    }
    CHECK_THROWS_WITH_AS(
        rerank_scores(s.engine->backend(), s.engine->kv_table(), judge, prompts, 64, 40),
        doctest::Contains("document 0 has"), Error);
    CHECK(s.engine->kv_table().n_used_blocks() == 0);
    // `kvrun embedding --pooling rank`: QUERY<tab>DOCUMENT per line, the same scores.
    {
        std::string lines;
        for (size_t i = 0; i < 3; ++i) lines += query + "\t" + docs[i] + "\n";
        const auto cli =
            kvrun::test::run_command(kvrun::test::kvrun_binary() + " embedding -m " + model +
                                         " --pooling rank --embd-output-format array",
                                     lines);
        REQUIRE_MESSAGE(cli.exit_code == 0, cli.err);
        const json a = json::parse(cli.out);
        REQUIRE(a.size() == 3);
        for (size_t i = 0; i < 3; ++i)
            CHECK(a[i].get<double>() == doctest::Approx(want[i]).epsilon(1e-5));
        const auto text = kvrun::test::run_command(
            kvrun::test::kvrun_binary() + " embedding -m " + model + " --pooling rank", lines);
        CHECK(text.out.find("rerank score 2: ") != std::string::npos);
        const auto no_tab = kvrun::test::run_command(
            kvrun::test::kvrun_binary() + " embedding -m " + model + " --pooling rank -p 'q d'");
        CHECK(no_tab.exit_code == 1);
        CHECK(no_tab.err.find("no tab") != std::string::npos);
        const auto too_long = kvrun::test::run_command(kvrun::test::kvrun_binary() +
                                                       " embedding -m " + model +
                                                       " --pooling rank -c 16",
                                                       lines);
        CHECK(too_long.exit_code == 1);
        CHECK(too_long.err.find("text 1 has") != std::string::npos);
    }

    ServerConfig cfg = s.config();
    {
        Running off(cfg, s);
        CHECK(off.post("/v1/rerank", {{"query", query}, {"documents", docs}}).status == 501);
    }
    cfg.rerank = std::make_shared<const RerankJudge>(judge);
    Running run(cfg, s);
    const HttpReply r = run.post("/v1/rerank", {{"query", query}, {"documents", docs}});
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const json j = json::parse(r.body);
    REQUIRE(j["results"].size() == docs.size());
    double before = 2;
    std::set<size_t> seen;
    for (const json& res : j["results"]) {
        const size_t i = res["index"];
        const double score = res["relevance_score"];
        CHECK(score == doctest::Approx(want[i]).epsilon(1e-5));
        CHECK(score <= before);  // most relevant first
        before = score;
        seen.insert(i);
        CHECK(!res.contains("document"));
    }
    CHECK(seen.size() == docs.size());
    CHECK(j["usage"]["prompt_tokens"].get<int>() > 40 * int(docs.size()));
    // top_n, the texts back, objects with "text", the other paths.
    const json top = json::parse(
        run.post("/rerank",
                 {{"query", query}, {"documents", docs}, {"top_n", 2}, {"return_text", true}})
            .body);
    REQUIRE(top["results"].size() == 2);
    CHECK(top["results"][0]["index"] == j["results"][0]["index"]);
    CHECK(top["results"][0]["document"]["text"] == docs[top["results"][0]["index"].get<size_t>()]);
    json objects = json::array();
    for (const std::string& d : docs) objects.push_back({{"text", d}});
    CHECK(json::parse(run.post("/v1/reranking", {{"query", query}, {"documents", objects}})
                          .body)["results"] == j["results"]);
    // Bad requests: one clear 400 each.
    for (const json& bad : {json{{"documents", docs}}, json{{"query", query}},
                            json{{"query", query}, {"documents", json::array()}},
                            json{{"query", query}, {"documents", {1, 2}}},
                            json{{"query", query}, {"documents", docs}, {"top_n", 0}}}) {
        const HttpReply b = run.post("/v1/rerank", bad);
        CHECK_MESSAGE(b.status == 400, bad.dump());
    }
    // A document longer than the context.
    const HttpReply big =
        run.post("/v1/rerank", {{"query", query}, {"documents", {std::string(4000, 'a')}}});
    CHECK(big.status == 400);
    CHECK(big.body.find("document 0 has") != std::string::npos);
    CHECK(big.body.find("more than the context of 512") != std::string::npos);
}
