// llama-server's slot persistence on `kvrun server --slot-save-path DIR`: a request's tokens
// are remembered in its slot ("id_slot", else the least recently used); POST
// /slots/{id}?action=save writes their cached K/V to a file, action=restore loads it into
// another server's prefix cache (the same prompt then skips those tokens' prefill and gives
// the same text), action=erase forgets them. Bad ids, actions, file names and files are
// refused with one message each.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "modes/prompt_cache_options.h"
#include "modes/server_slots.h"
#include "server_test_util.h"
#include "synthetic_model.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

namespace {

constexpr const char* kPrompt =
    "One day a little girl named Lily found a needle in her room. She knew it was difficult "
    "to play with it because it was sharp.";

struct SlotServer {
    Served s;
    std::unique_ptr<Running> run;
    SlotServer(const std::string& model, const std::string& dir)
        : s(Served::options(model), /*parallel=*/2) {
        ServerConfig cfg = s.config();
        cfg.parallel = 2;
        cfg.slot_save_path = dir;
        if (!dir.empty()) cfg.slot_key = prompt_cache_key_for(Served::options(model), s.m);
        run = std::make_unique<Running>(cfg, s);
    }
    HttpReply action(const std::string& slot_action, json body = json::object()) {
        return run->post("/slots/" + slot_action, body);
    }
    std::string complete(json extra = json::object()) {
        json body = {{"prompt", kPrompt}, {"n_predict", 12}, {"temperature", 0}};
        body.update(extra);
        const HttpReply r = run->post("/completion", body);
        REQUIRE_MESSAGE(r.status == 200, r.body);
        return json::parse(r.body)["content"].get<std::string>();
    }
};

std::string error_message(const HttpReply& r) {
    return json::parse(r.body)["error"]["message"].get<std::string>();
}

}  // namespace

TEST_CASE("server slots: save a slot's K/V, restore it in another server, erase") {
    TempDir dir;
    SyntheticModelConfig c = synthetic_preset("tiny");
    c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 96, c.n_vocab = 300;
    c.seed = 11;
    const std::string model = dir.file("m.gguf");
    synthetic_model_write(c, model);
    const std::string saves = dir.file("slots");
    std::filesystem::create_directory(saves);

    std::string text;
    int64_t n_saved = 0, n_tokens = 0;
    {
        SlotServer a(model, saves);
        text = a.complete({{"id_slot", 1}});
        const HttpReply saved = a.action("1?action=save", {{"filename", "conv.bin"}});
        REQUIRE_MESSAGE(saved.status == 200, saved.body);
        const json j = json::parse(saved.body);
        CHECK(j["id_slot"] == 1);
        CHECK(j["filename"] == "conv.bin");
        n_saved = j["n_saved"].get<int64_t>();
        const int32_t bs = a.s.engine->kv_table().block_size();
        n_tokens = int64_t(a.s.m.tokenizer->encode(kPrompt, true, false).size()) + 12;
        CHECK(n_saved > 0);
        CHECK(n_saved % bs == 0);
        CHECK(n_saved <= n_tokens);
        CHECK(j["n_written"].get<int64_t>() ==
              int64_t(std::filesystem::file_size(saves + "/conv.bin")));
        CHECK(j["timings"].contains("save_ms"));

        // Slot 0 ran nothing: its file holds no blocks. A request without id_slot takes the
        // least recently used slot (0), and then slot 0 has tokens too.
        const HttpReply empty = a.action("0?action=save", {{"filename", "empty.bin"}});
        REQUIRE_MESSAGE(empty.status == 200, empty.body);
        CHECK(json::parse(empty.body)["n_saved"] == 0);
        CHECK(a.complete() == text);
        const HttpReply zero = a.action("0?action=save", {{"filename", "zero.bin"}});
        CHECK(json::parse(zero.body)["n_saved"] == n_saved);

        const HttpReply erased = a.action("1?action=erase");
        REQUIRE_MESSAGE(erased.status == 200, erased.body);
        CHECK(json::parse(erased.body)["n_erased"] == n_tokens);
        CHECK(json::parse(a.action("1?action=erase").body)["n_erased"] == 0);

        // Refusals, one message each.
        struct Bad {
            std::string action;
            json body;
            int status;
            std::string says;
        };
        const Bad bad[] = {
            {"2?action=save", {{"filename", "x.bin"}}, 400, "no slot '2'"},
            {"abc?action=save", {{"filename", "x.bin"}}, 400, "no slot 'abc'"},
            {"0?action=load", {{"filename", "x.bin"}}, 400, "unknown slot action 'load'"},
            {"0", {{"filename", "x.bin"}}, 400, "unknown slot action ''"},
            {"0?action=save", {{"filename", "../x.bin"}}, 400, "invalid slot file name"},
            {"0?action=save", {{"filename", ".hidden"}}, 400, "invalid slot file name"},
            {"0?action=save", {{"filename", ""}}, 400, "invalid slot file name"},
            {"0?action=save", json::object(), 400, "\"filename\""},
            {"0?action=restore", {{"filename", "missing.bin"}}, 404, "no slot file 'missing.bin'"},
        };
        for (const Bad& b : bad) {
            CAPTURE(b.action);
            const HttpReply r = a.action(b.action, b.body);
            CHECK(r.status == b.status);
            CHECK_MESSAGE(error_message(r).find(b.says) != std::string::npos, r.body);
        }
        CHECK(a.run->get("/slots/0").status == 405);
        const HttpReply wrong_slot =
            a.run->post("/completion", {{"prompt", "x"}, {"n_predict", 1}, {"id_slot", 2}});
        CHECK(wrong_slot.status == 400);
        CHECK(error_message(wrong_slot).find("'id_slot' 2 is not a slot") != std::string::npos);
        CHECK(a.run->post("/completion", {{"prompt", "x"}, {"id_slot", "one"}}).status == 400);
        std::ofstream(saves + "/junk.bin") << "not a slot file";
        const HttpReply junk = a.action("0?action=restore", {{"filename", "junk.bin"}});
        CHECK(junk.status == 400);
        CHECK(error_message(junk).find("not a kvrun prompt cache") != std::string::npos);
    }

    // A fresh server: the restored blocks serve the same prompt (fewer tokens computed, the
    // same greedy text), and saving the restored slot writes the same blocks again.
    SlotServer b(model, saves);
    CHECK(b.run->metric("prefix_cache_hit_tokens_total") == 0);
    const HttpReply restored = b.action("1?action=restore", {{"filename", "conv.bin"}});
    REQUIRE_MESSAGE(restored.status == 200, restored.body);
    const json r = json::parse(restored.body);
    CHECK(r["id_slot"] == 1);
    CHECK(r["n_restored"] == n_saved);
    CHECK(r["n_read"].get<int64_t>() == int64_t(std::filesystem::file_size(saves + "/conv.bin")));
    CHECK(b.complete() == text);
    CHECK(b.run->metric("prefix_cache_hit_tokens_total") > 0);
    const HttpReply again = b.action("1?action=save", {{"filename", "again.bin"}});
    CHECK(json::parse(again.body)["n_saved"] == n_saved);

    // Without --slot-save-path the actions are off; a missing directory is refused at start.
    SlotServer off(model, "");
    const HttpReply r501 = off.action("0?action=save", {{"filename", "x.bin"}});
    CHECK(r501.status == 501);
    CHECK(error_message(r501).find("--slot-save-path") != std::string::npos);
    CHECK_THROWS_WITH_AS(ServerSlots(2, dir.file("nowhere"), {}),
                         doctest::Contains("no such directory"), Error);
}

TEST_CASE("server slots: file names as llama-server allows them") {
    CHECK(slot_filename_ok("conv.bin"));
    CHECK(slot_filename_ok("chat 2024-01-01 (1).bin"));
    CHECK(slot_filename_ok("\xc3\xa9t\xc3\xa9.bin"));
    CHECK_FALSE(slot_filename_ok(""));
    CHECK_FALSE(slot_filename_ok("."));
    CHECK_FALSE(slot_filename_ok(".."));
    CHECK_FALSE(slot_filename_ok(".bin"));
    CHECK_FALSE(slot_filename_ok("a/b"));
    CHECK_FALSE(slot_filename_ok("a\\b"));
    CHECK_FALSE(slot_filename_ok("c:x"));
    CHECK_FALSE(slot_filename_ok("a\nb"));
    CHECK_FALSE(slot_filename_ok("\xff.bin"));
    CHECK_FALSE(slot_filename_ok(std::string(256, 'a')));
}
