// llama-server's /lora-adapters on `kvrun server`: GET lists the loaded adapters and the
// scales of requests that give no "lora"; POST sets those scales (left-out adapters at 0).
// Generation, embeddings and a request's own "lora" all follow, checked against the CLI's
// --lora-scaled runs on a synthetic model with a random adapter; bad bodies are refused and
// change nothing.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf.h"
#include "lora_test_util.h"
#include "server_test_util.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

TEST_CASE("server /lora-adapters: the scales of requests without \"lora\", listed and set") {
    TempDir dir;
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96, c.n_vocab = 300;
    c.weight_std = 0.15f;
    c.seed = 5;
    const std::string base_path = dir.file("base.gguf"), lora_path = dir.file("lora.gguf");
    synthetic_model_write(c, base_path);
    {
        GgufFile base = GgufFile::open(base_path);
        write_adapter(lora_path, "llama", 16.0,
                      {random_factors(base, "blk.0.attn_k.weight", 8, 1),
                       random_factors(base, "output.weight", 8, 2)});
    }
    const std::string prompt = "Once upon a time there";
    // What `kvrun run` writes with these adapter flags (greedy, 12 tokens).
    auto cli = [&](const std::string& lora_flags) {
        auto r = run_command(kvrun_binary() + " run -m " + base_path + " " + lora_flags +
                             " -n 12 --temp 0 --device cpu -p " + shell_quote(prompt));
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        return r.out.substr(0, r.out.size() - 1);  // (its final newline)
    };
    const std::string full = cli("--lora " + lora_path);
    const std::string half = cli("--lora-scaled " + lora_path + " 0.5");
    const std::string plain = cli("");
    REQUIRE(full != half);
    REQUIRE(full != plain);

    ModelOptions o = Served::options(base_path);
    o.lora = {lora_path};
    Served s(o, 2);
    ServerConfig cfg = s.config();
    cfg.lora_paths = {lora_path};
    cfg.api.defaults.n_lora = 1;
    Running run(cfg, s);
    auto complete = [&](json extra = json::object()) {
        json body = {{"prompt", prompt}, {"n_predict", 12}, {"temperature", 0}};
        body.update(extra);
        const HttpReply r = run.post("/completion", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        return json::parse(r.body)["content"].get<std::string>();
    };
    auto embed = [&] {
        const HttpReply r = run.post("/v1/embeddings", {{"input", prompt}});
        REQUIRE_MESSAGE(r.status == 200, r.body);
        return json::parse(r.body)["data"][0]["embedding"];
    };
    auto scale = [&] {
        const json l = json::parse(run.get("/lora-adapters").body);
        REQUIRE(l.size() == 1);
        CHECK(l[0]["id"] == 0);
        CHECK(l[0]["path"] == lora_path);
        return l[0]["scale"].get<double>();
    };

    CHECK(scale() == 1.0);  // as loaded (--lora)
    CHECK(complete() == full);
    const json embedding_full = embed();

    const HttpReply set = run.post("/lora-adapters", json::array({{{"id", 0}, {"scale", 0.5}}}));
    CHECK_MESSAGE(set.status == 200, set.body);
    CHECK(json::parse(set.body)["success"] == true);
    CHECK(scale() == 0.5);
    CHECK(complete() == half);
    CHECK(embed() != embedding_full);
    // A request's own "lora" still wins.
    CHECK(complete({{"lora", json::array({{{"id", 0}, {"scale", 1}}})}}) == full);
    // The prompt's echoed log-probabilities follow the scales too (here, a request's own).
    auto echoed = [&](json extra) {
        json body = {{"prompt", prompt}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}};
        body.update(extra);
        const HttpReply r = run.post("/v1/completions", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        return json::parse(r.body)["choices"][0]["logprobs"]["token_logprobs"];
    };
    const json echo_half = echoed(json::object());
    CHECK(echo_half == echoed({{"lora", json::array({{{"id", 0}, {"scale", 0.5}}})}}));
    CHECK(echo_half != echoed({{"lora", json::array({{{"id", 0}, {"scale", 1}}})}}));

    // An empty list sets every adapter to 0: the base model.
    CHECK(run.post("/lora-adapters", json::array()).status == 200);
    CHECK(scale() == 0.0);
    CHECK(complete() == plain);

    // Bad bodies: 400, the scales unchanged.
    for (const std::string& bad :
         {std::string(R"([{"id": 3, "scale": 1}])"), std::string(R"({"id": 0, "scale": 1})"),
          std::string("[{"), std::string(R"([{"id": 0, "scale": "big"}])")}) {
        CAPTURE(bad);
        HttpClient client(run.server.port());
        const HttpReply r = client.request("POST", "/lora-adapters", bad);
        CHECK(r.status == 400);
        CHECK(scale() == 0.0);
    }

    // Back to the loaded scale: generation and embeddings as at the start.
    CHECK(run.post("/lora-adapters", json::array({{{"id", 0}, {"scale", 1}}})).status == 200);
    CHECK(complete() == full);
    CHECK(embed() == embedding_full);
}
