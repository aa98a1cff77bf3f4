// The server's chat page (GET /): served unless --no-webui, and its script, run under node
// against the server with a stand-in DOM, chats as the server answers, a thinking model's
// reasoning shown apart.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "chat_template.h"
#include "server_test_util.h"
#include "test_util.h"

using namespace kvrun;
using namespace kvrun::test;
using nlohmann::json;

TEST_CASE("server: GET / is the chat page, which shows reasoning apart") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    Running run(s.config(), s);
    const HttpReply r = run.get("/");
    CHECK(r.status == 200);
    CHECK(r.body.find("v1/chat/completions") != std::string::npos);
    CHECK(r.body.find("delta.reasoning_content") != std::string::npos);
}

TEST_CASE("server: --no-webui leaves GET / unanswered") {
    const std::string path = model_path();
    if (path.empty()) return;
    Served s(path);
    ServerConfig cfg = s.config();
    cfg.web_ui = false;
    Running run(cfg, s);
    CHECK(run.get("/").status == 404);
}

namespace {

// The chat page's script run under node against `run` (a stand-in DOM; fetch goes to the
// server), sending one message as the form would: its JSON {model, messages, thinking} (the
// text of the page's reasoning element).
json run_page(Running& run) {
    const std::string page = run.get("/").body;
    const size_t a = page.find("<script>"), b = page.find("</script>");
    REQUIRE(a != std::string::npos);
    REQUIRE(b != std::string::npos);
    kvrun::test::TempDir dir;
    const std::string script = dir.file("page.js"), harness = dir.file("harness.js");
    std::ofstream(script) << page.substr(a + 8, b - a - 8);
    std::ofstream(harness) << "const base = 'http://127.0.0.1:" << run.server.port() << "/';\n"
                           << R"JS(
const realFetch = fetch;
globalThis.fetch = (u, o) => realFetch(base + u, o);
const made = [];
const el = () => ({textContent: '', className: '', innerHTML: '', value: '', scrollTop: 0,
                   scrollHeight: 0, hidden: false, appendChild() {}});
const els = {};
globalThis.document = {getElementById: id => (els[id] = els[id] || el()),
                       createElement: () => { const e = el(); made.push(e); return e; }};
globalThis.localStorage = {getItem: () => null, setItem() {}};
eval(require('fs').readFileSync(process.argv[2], 'utf8') + `
(async () => {
  await new Promise(r => setTimeout(r, 300));
  await ask('Tell me a story');
  const t = made.find(e => e.className === 'thinking');
  console.log(JSON.stringify({model: els.model.textContent, messages,
                              thinking: t && !t.hidden ? t.textContent : null}));
})();`);
)JS";
    const auto r = kvrun::test::run_command("node " + harness + " " + script);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return json::parse(r.out);
}

bool have_node() {
    if (kvrun::test::run_command("command -v node >/dev/null 2>&1 && echo yes").out == "yes\n")
        return true;
    MESSAGE("SKIP: node is not installed; the chat page's script is not run");
    return false;
}

}  // namespace

TEST_CASE("server: the chat page's script chats with the server (under node, when present)") {
    const std::string path = model_path();
    if (path.empty() || !have_node()) return;
    Served s(path);
    ServerConfig cfg = s.config();
    cfg.api.defaults.n_predict = 12;
    Running run(cfg, s);
    const json j = run_page(run);
    CHECK(j["model"] == "stories");
    REQUIRE(j["messages"].size() == 2);
    CHECK(j["messages"][1]["role"] == "assistant");
    CHECK(j["thinking"].is_null());  // no reasoning: its element stays hidden
    // The page's streamed reply is the server's whole answer to the same conversation (the
    // same default seed and logits: the same draw).
    const HttpReply whole =
        run.post("/v1/chat/completions",
                 {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}}});
    REQUIRE(whole.status == 200);
    CHECK_FALSE(j["messages"][1]["content"].get<std::string>().empty());
    CHECK(j["messages"][1]["content"] ==
          json::parse(whole.body)["choices"][0]["message"]["content"]);
}

TEST_CASE("server: the chat page shows a thinking model's reasoning apart (under node)") {
    const std::string path = model_path();
    if (path.empty() || !have_node()) return;
    Served s(path);
    ServerConfig cfg = s.config();
    cfg.api.defaults.n_predict = 12;
    // A template that opens a reasoning block: the story model's reply is all reasoning.
    s.set_chat(cfg, ChatTemplateKind::ChatML,
               std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(
                   "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                   "{% endfor %}<|im_start|>assistant\n<think>\n")));
    Running run(cfg, s);
    const json j = run_page(run);
    const json whole =
        json::parse(run.post("/v1/chat/completions",
                             {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}}})
                        .body)["choices"][0]["message"];
    REQUIRE(whole.contains("reasoning_content"));
    CHECK(j["thinking"] == whole["reasoning_content"]);
    CHECK(j["messages"][1]["content"] == "");  // the history keeps the answer only
}
