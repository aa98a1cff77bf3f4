// End-to-end tests of `kvrun chat` in a real terminal: the chat runs inside a detached tmux
// session of fixed size, driven with send-keys and read with capture-pane (every wait polls
// with a timeout, and the tmux server is killed at the end). Checks: two turns where /stats
// shows the second turn prefilled only its new tokens, Ctrl-C mid-reply returns to the
// prompt, Ctrl-C while typing clears the line, and Ctrl-D exits 0. Also the same chat with
// piped stdin (no terminal). Skips with a message when tmux or ../shared is missing.
// Through the ChatSession API: --context-overflow stop (refused messages keep the previous
// turn's stats) and shift (before a turn and in the middle of a reply), and a chat with a
// draft model (CLI) giving the same replies.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "backend.h"
#include "chat_session.h"
#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "grammar.h"
#include "jinja.h"
#include "test_util.h"
#include "tokenizer.h"

using kvrun::test::run_command;
using kvrun::test::shell_quote;

namespace {

bool have_tmux() {
    return run_command("command -v tmux >/dev/null 2>&1 && echo yes").out == "yes\n";
}

// A detached tmux session (own server socket) running one command; killed on destruction.
class Tmux {
  public:
    explicit Tmux(const std::string& command)
        : socket_("kvrun_test_chat_" + std::to_string(::getpid()) + "_" +
                  std::to_string(counter_++)) {
        // The shell prints the exit code, then idles so the pane can still be read.
        std::string inner = command + "; echo KVRUN_EXIT=$?; sleep 120";
        auto r = run_command(tmux("new-session -d -s chat -x 160 -y 50 " + shell_quote(inner)));
        ok_ = r.exit_code == 0;
        if (!ok_) MESSAGE("tmux failed to start: " << r.err);
    }
    ~Tmux() { run_command(tmux("kill-server")); }
    bool ok() const { return ok_; }

    void keys(const std::string& args) { run_command(tmux("send-keys -t chat " + args)); }
    void type_line(const std::string& text) {
        keys("-l " + shell_quote(text));
        keys("Enter");
    }
    // The whole pane (history included, wrapped lines joined).
    std::string screen() { return run_command(tmux("capture-pane -p -J -S - -t chat")).out; }
    // Polls until pred(screen) holds; false (and the screen in the log) after the timeout.
    template <class Pred>
    bool wait_for(Pred pred, const char* what, double seconds = 30) {
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        std::string s;
        while (std::chrono::steady_clock::now() < until) {
            s = screen();
            if (pred(s)) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        MESSAGE("timed out waiting for " << what << "; screen:\n" << s);
        return false;
    }

  private:
    std::string tmux(const std::string& args) const { return "tmux -L " + socket_ + " " + args; }
    static inline int counter_ = 0;
    std::string socket_;
    bool ok_ = false;
};

// Number of prompt lines ("> ...") on the screen.
int count_prompts(const std::string& screen) {
    int n = 0;
    std::istringstream in(screen);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("> ", 0) == 0 || line == ">") ++n;
    return n;
}

int count_of(const std::string& s, const std::string& needle) {
    int n = 0;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
    return n;
}

struct Stats {
    int conversation = -1, cached = -1, prefilled = -1, appended = -1, reused = -1, reply = -1;
    std::string stop;
};

// The numbers of the last /stats block on the screen.
Stats last_stats(const std::string& screen) {
    Stats st;
    std::smatch m;
    std::string s = screen.substr(
        screen.rfind("conversation ") == std::string::npos ? 0 : screen.rfind("conversation "));
    if (std::regex_search(s, m,
                          std::regex(R"(conversation\s+(\d+) tokens \((\d+) in the KV cache\))")))
        st.conversation = std::stoi(m[1]), st.cached = std::stoi(m[2]);
    if (std::regex_search(s, m,
                          std::regex(R"(prefilled (\d+) tokens \((\d+) new\), reused (\d+))")))
        st.prefilled = std::stoi(m[1]), st.appended = std::stoi(m[2]), st.reused = std::stoi(m[3]);
    if (std::regex_search(s, m, std::regex(R"(reply\s+(\d+) tokens, stop: (\w+))")))
        st.reply = std::stoi(m[1]), st.stop = m[2];
    return st;
}

std::string chat_cmd(const std::string& model, const std::string& args) {
    return kvrun::test::kvrun_binary() + " chat -m " + model + " " + args;
}

}  // namespace

TEST_CASE("chat in a terminal: the second turn prefills only its new tokens; Ctrl-D exits 0") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    if (!have_tmux()) {
        MESSAGE("SKIP: tmux is not installed");
        return;
    }
    Tmux t(chat_cmd(model.string(), "--temp 0 -n 24 -c 512"));
    REQUIRE(t.ok());
    REQUIRE(
        t.wait_for([](const std::string& s) { return count_prompts(s) == 1; }, "the first prompt"));

    t.type_line("Once upon a time");
    REQUIRE(
        t.wait_for([](const std::string& s) { return count_prompts(s) == 2; }, "the first reply"));
    t.type_line("/stats");
    REQUIRE(t.wait_for(
        [](const std::string& s) { return count_of(s, "last turn") == 1 && count_prompts(s) == 3; },
        "/stats"));
    Stats s1 = last_stats(t.screen());
    CHECK(s1.reused == 0);
    CHECK(s1.prefilled == s1.appended);  // the first turn computes its whole prompt
    CHECK(s1.reply == 24);
    CHECK(s1.conversation == s1.appended + s1.reply);

    t.type_line("The dog ran to the park");
    REQUIRE(
        t.wait_for([](const std::string& s) { return count_prompts(s) == 4; }, "the second reply"));
    t.type_line("/stats");
    REQUIRE(t.wait_for(
        [](const std::string& s) { return count_of(s, "last turn") == 2 && count_prompts(s) == 5; },
        "the second /stats"));
    Stats s2 = last_stats(t.screen());
    // Everything turn 1 left in the KV cache was reused; only the tokens not in the cache
    // were prefilled: the new message (and turn 1's last sampled token, never fed).
    CHECK(s2.reused == s1.cached);
    CHECK(s2.prefilled == s1.conversation - s1.cached + s2.appended);
    CHECK(s2.appended > 0);
    CHECK(s2.appended < 40);  // "\nUser: The dog ran to the park\nAssistant:"
    CHECK(s2.conversation == s1.conversation + s2.appended + s2.reply);

    // Ctrl-C while typing clears the line: the next command runs alone.
    t.keys("-l 'half typed'");
    REQUIRE(
        t.wait_for([](const std::string& s) { return s.find("> half typed") != std::string::npos; },
                   "the half-typed line"));
    t.keys("C-c");
    // Type only once the fresh prompt is there (keys sent earlier could reach the old line
    // before the interrupt is handled on a busy machine).
    REQUIRE(t.wait_for([](const std::string& s) { return count_prompts(s) >= 6; },
                       "a fresh prompt after Ctrl-C"));
    t.type_line("/help");
    REQUIRE(t.wait_for(
        [](const std::string& s) {
            return s.find("/reset") != std::string::npos && count_prompts(s) >= 7;
        },
        "/help after Ctrl-C"));
    CHECK(t.screen().find("unknown command") == std::string::npos);

    t.keys("C-d");
    REQUIRE(t.wait_for(
        [](const std::string& s) { return s.find("KVRUN_EXIT=") != std::string::npos; }, "exit"));
    CHECK(t.screen().find("KVRUN_EXIT=0") != std::string::npos);
}

TEST_CASE("chat: Ctrl-C mid-reply stops the reply and returns to the prompt") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    if (!have_tmux()) {
        MESSAGE("SKIP: tmux is not installed");
        return;
    }
    // An endless reply: no end-of-turn, no length limit, the context window slides (sinks).
    Tmux t(chat_cmd(model.string(), "--temp 0 -n -1 --ignore-eos --context-overflow sinks -c 256"));
    REQUIRE(t.ok());
    REQUIRE(t.wait_for([](const std::string& s) { return count_prompts(s) == 1; }, "the prompt"));
    t.type_line("Once upon a time");
    REQUIRE(
        t.wait_for([](const std::string& s) { return s.find("context full") != std::string::npos; },
                   "a reply that outgrows the context"));
    t.keys("C-c");
    REQUIRE(t.wait_for(
        [](const std::string& s) {
            return s.find("[interrupted]") != std::string::npos && count_prompts(s) == 2;
        },
        "the prompt after Ctrl-C"));
    t.type_line("/stats");
    REQUIRE(t.wait_for(
        [](const std::string& s) {
            return s.find("last turn") != std::string::npos && count_prompts(s) == 3;
        },
        "/stats"));
    Stats st = last_stats(t.screen());
    CHECK(st.stop == "cancelled");
    CHECK(st.reply > 0);
    CHECK(st.conversation < 256);  // the sliding window kept it inside the context
    // The conversation goes on after the interruption.
    t.type_line("/reset");
    REQUIRE(t.wait_for(
        [](const std::string& s) { return s.find("[new conversation]") != std::string::npos; },
        "/reset"));
    t.keys("C-d");
    REQUIRE(t.wait_for(
        [](const std::string& s) { return s.find("KVRUN_EXIT=") != std::string::npos; }, "exit"));
    CHECK(t.screen().find("KVRUN_EXIT=0") != std::string::npos);
}

TEST_CASE("chat with piped input: replies on stdout, commands work, EOF exits 0") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    auto r = run_command(chat_cmd(model.string(), "--temp 0 -n 12 --system 'Tell a story.'"),
                         "Once upon a time\n/stats\n/nonsense\n/system\n/reset\nHello\n");
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("conversation") != std::string::npos);
    CHECK(r.out.find("unknown command /nonsense") != std::string::npos);
    CHECK(r.out.find("[system prompt cleared; new conversation]") != std::string::npos);
    CHECK(r.err.find("template plain") != std::string::npos);
    // Same greedy reply as running the formatted prompt directly.
    auto direct = run_command(kvrun::test::kvrun_binary() + " run -m " + model.string() +
                              " --temp 0 -n 12 -p " +
                              shell_quote("Tell a story.\n\nUser: Once upon a time\nAssistant:"));
    REQUIRE(direct.exit_code == 0);
    std::string first_reply = r.out.substr(0, r.out.find('\n'));
    std::string expected = direct.out.substr(0, direct.out.find('\n'));
    expected.erase(0, expected.find_first_not_of(' '));
    CHECK(first_reply == expected);
    // /undo, /regen (greedy: the same reply again), /read FILE, /clear.
    kvrun::test::TempDir dir;
    const std::string msg = dir.write("msg.txt", "Once upon a time");
    auto cmds = run_command(
        chat_cmd(model.string(), "--temp 0 -n 12 --system 'Tell a story.'"),
        "Once upon a time\n/regen\n/undo\n/undo\n/read " + msg + "\n/read /no/such/file\n/clear\n");
    CHECK(cmds.exit_code == 0);
    std::vector<std::string> out_lines;
    std::istringstream cin(cmds.out);
    for (std::string l; std::getline(cin, l);) out_lines.push_back(l);
    REQUIRE(out_lines.size() >= 6);
    CHECK(out_lines[0] == first_reply);
    CHECK(out_lines[1] == first_reply);
    CHECK(out_lines[2] == "[took back the last exchange]");
    CHECK(out_lines[3] == "[nothing to take back]");
    CHECK(out_lines[4] == first_reply);  // /read sent the same text
    CHECK(out_lines[5] == "[new conversation]");
    CHECK(cmds.err.find("cannot open '/no/such/file'") != std::string::npos);
    // llama.cpp's -sys / --system-prompt spell --system.
    for (const char* flag : {"-sys", "--system-prompt"}) {
        auto sys = run_command(
            chat_cmd(model.string(), std::string("--temp 0 -n 12 ") + flag + " 'Tell a story.'"),
            "Once upon a time\n");
        CHECK(sys.out.substr(0, sys.out.find('\n')) == first_reply);
    }
    // Bad template names and overflow policies are one clear error.
    auto bad = run_command(chat_cmd(model.string(), "--chat-template nope"), "");
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("unknown chat template 'nope'") != std::string::npos);

    // --json-schema: every reply is a JSON object of the schema.
    const std::string schema =
        R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},)"
        R"("age":{"type":"integer","minimum":1,"maximum":99}},"required":["name","age"]})";
    auto js = run_command(
        chat_cmd(model.string(), "--temp 0.8 -s 3 -n 80 --json-schema " + shell_quote(schema)),
        "Tell me about Lily\nAnd Tom?\n");
    CHECK_MESSAGE(js.exit_code == 0, js.err);
    // Replies may span lines (the schema's whitespace allows newlines): read value by value.
    std::istringstream in(js.out);
    int replies = 0;
    while ((in >> std::ws).peek() != EOF) {
        nlohmann::json j;
        REQUIRE_NOTHROW(in >> j);
        CAPTURE(j.dump());
        CHECK(j["name"].is_string());
        CHECK(j["age"].get<int>() >= 1);
        CHECK(j["age"].get<int>() <= 99);
        ++replies;
    }
    CHECK(replies == 2);
    auto bad_grammar = run_command(chat_cmd(model.string(), "--grammar 'root ::= foo'"), "hi\n");
    CHECK(bad_grammar.exit_code == 1);
    CHECK(bad_grammar.err.find("rule `foo` is used but never defined") != std::string::npos);
}

namespace {

// stories260K on the CPU with a pool of `n_blocks` blocks of 16 tokens.
struct ChatModel {
    kvrun::GgufFile file;
    std::unique_ptr<kvrun::Tokenizer> tok;
    std::unique_ptr<kvrun::Backend> backend;
    ChatModel(const std::string& path, int64_t n_blocks) : file(kvrun::GgufFile::open(path)) {
        tok = kvrun::Tokenizer::from_gguf(file);
        kvrun::BackendOptions o;
        o.n_kv_blocks = n_blocks;
        o.n_threads = 1;
        backend = kvrun::make_cpu_backend(file, o);
    }
};

struct Notices {
    std::vector<std::string> list;
    kvrun::ChatSession::TextSink sink() {
        return [this](std::string_view s) { list.emplace_back(s); };
    }
    bool has(const std::string& needle) const {
        for (const auto& n : list)
            if (n.find(needle) != std::string::npos) return true;
        return false;
    }
};

const kvrun::ChatSession::TextSink kIgnore = [](std::string_view) {};

// The greedy tokens the engine generates for `prompt` from scratch.
std::vector<kvrun::TokenId> fresh_reply(ChatModel& m, const std::vector<kvrun::TokenId>& prompt,
                                        int32_t n, const std::vector<std::string>& stops) {
    kvrun::Engine e(*m.backend, *m.tok, kvrun::EngineOptions{});
    kvrun::GenerationRequest r;
    r.prompt = prompt;
    r.n_predict = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.stop_strings = stops;
    std::vector<kvrun::TokenId> out;
    e.on_finish([&](const kvrun::GenerationResult& g) { out = g.tokens; });
    e.submit(r);
    e.run();
    return out;
}

}  // namespace

TEST_CASE(
    "ChatSession --context-overflow stop: the reply ends at the context, messages that "
    "no longer fit are refused, /stats keeps the last turn") {
    using namespace kvrun;
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    ChatModel m(model.string(), 64);
    EngineOptions eo;
    eo.n_ctx = 128;
    Engine engine(*m.backend, *m.tok, eo);
    ChatConfig cfg;
    cfg.n_predict = 30;
    cfg.sampling.temperature = 0;
    cfg.ignore_eos = true;
    cfg.overflow = ContextOverflow::Stop;
    ChatSession chat(engine, *m.tok, cfg);
    Notices notes;
    chat.send("Once upon a time", kIgnore, notes.sink());
    const ChatTurnStats first = chat.last_turn();
    CHECK(first.n_generated > 0);
    CHECK(first.n_prefilled == first.n_appended);
    CHECK(first.stop != StopReason::Context);

    // A message too long for what is left of the context: refused, nothing changes.
    std::string long_msg;
    for (int i = 0; i < 12; ++i) long_msg += " The dog ran to the park.";
    const int32_t before = chat.n_tokens();
    const size_t n_messages = chat.messages().size();
    CHECK_THROWS_WITH_AS(chat.send(long_msg, kIgnore, notes.sink()),
                         doctest::Contains("does not fit in the context"), Error);
    CHECK(chat.n_tokens() == before);
    CHECK(chat.messages().size() == n_messages);
    // The stats are still those of the turn that was sent (not "prefilled 0 (N new)").
    CHECK(chat.last_turn().n_appended == first.n_appended);
    CHECK(chat.last_turn().n_prefilled == first.n_prefilled);
    CHECK(chat.last_turn().n_generated == first.n_generated);

    // A reply that runs into the context ends there, with a notice.
    ChatConfig endless = cfg;
    endless.n_predict = -1;
    ChatSession chat2(engine, *m.tok, endless);
    chat2.send("Once upon a time", kIgnore, notes.sink());
    CHECK(chat2.last_turn().stop == StopReason::Context);
    CHECK(notes.has("[context full: the reply stops here"));
    CHECK(chat2.n_tokens() == engine.n_ctx());
    CHECK(chat2.last_turn().n_overflows == 0);
    // Now nothing fits; /reset starts over.
    CHECK_THROWS_AS(chat2.send("Hello", kIgnore, notes.sink()), Error);
    CHECK(chat2.last_turn().stop == StopReason::Context);
    chat2.reset();
    CHECK(chat2.n_tokens() == 0);
    chat.send("Hello", kIgnore, notes.sink());
    CHECK(chat.last_turn().n_generated == 30);
    CHECK(chat.messages().size() == 4);
}

TEST_CASE(
    "ChatSession --context-overflow shift: drops the oldest turns, before a turn and "
    "inside a reply, and continues with the tokens of a fresh run") {
    using namespace kvrun;
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    ChatModel m(model.string(), 64);
    EngineOptions eo;
    eo.n_ctx = 160;
    Engine engine(*m.backend, *m.tok, eo);
    ChatConfig cfg;
    cfg.system = "Tell a story.";
    cfg.n_predict = 24;
    cfg.sampling.temperature = 0;
    cfg.ignore_eos = true;
    cfg.overflow = ContextOverflow::Shift;
    ChatSession chat(engine, *m.tok, cfg);
    Notices notes;
    const char* msgs[] = {"Once upon a time", "The dog ran to the park", "Lily saw a bird",
                          "They played with a ball", "Mom called them home"};
    int shifted_turn = -1;
    size_t before_shift = 0;
    for (int i = 0; i < 5 && shifted_turn < 0; ++i) {
        before_shift = chat.messages().size();
        chat.send(msgs[i], kIgnore, notes.sink());
        if (chat.last_turn().n_overflows > 0) shifted_turn = i;
    }
    REQUIRE(shifted_turn > 0);
    CHECK(notes.has("[context full: dropped the"));
    // The system prompt stays; older turns are gone; the conversation fits again.
    CHECK(chat.messages().front().role == "system");
    CHECK(chat.messages().front().content == "Tell a story.");
    CHECK(chat.messages().size() < before_shift + 2);
    CHECK(chat.messages()[chat.messages().size() - 2].content == msgs[shifted_turn]);
    CHECK(chat.n_tokens() < engine.n_ctx());
    // The reply after the shift is what the rebuilt conversation gives from scratch.
    std::vector<ChatMessage> rebuilt(chat.messages().begin(), chat.messages().end() - 1);
    ChatSpecialTexts special;
    special.bos = m.tok->token_text(m.tok->bos());
    special.eos = m.tok->token_text(m.tok->eos());
    const auto prompt =
        m.tok->encode(chat_template_apply(cfg.chat_template.kind, rebuilt, true, special),
                      m.tok->add_bos(), true);
    CHECK(chat.last_turn().n_prefilled == int32_t(prompt.size()));
    const auto want = fresh_reply(m, prompt, cfg.n_predict, chat.stop_strings());
    std::string want_text = m.tok->decode(want, false);
    want_text.erase(0, want_text.find_first_not_of(" \t\r\n"));
    for (const std::string& stop : chat.stop_strings())
        if (want_text.find(stop) != std::string::npos) want_text.resize(want_text.find(stop));
    CHECK(chat.messages().back().content == want_text);

    // A reply longer than what is left: shifts in the middle and still delivers every token.
    ChatConfig long_cfg = cfg;
    long_cfg.n_predict = 110;
    long_cfg.system.clear();
    ChatSession long_chat(engine, *m.tok, long_cfg);
    Notices long_notes;
    long_chat.send("Once upon a time", kIgnore, long_notes.sink());
    long_chat.send("The dog ran to the park", kIgnore, long_notes.sink());
    const ChatTurnStats& t = long_chat.last_turn();
    MESSAGE("shift before turn " << shifted_turn << "; long reply: " << t.n_generated
                                 << " tokens, stop " << std::string(stop_reason_name(t.stop))
                                 << ", " << t.n_overflows << " overflow(s)");
    CHECK(t.n_overflows >= 1);
    CHECK(long_notes.has("[context full: dropped the"));
    CHECK(t.stop == StopReason::Length);
    CHECK(t.n_generated == 110);
    CHECK(long_chat.n_tokens() < engine.n_ctx());
}

TEST_CASE("chat with a draft model (piped): the same replies, /stats shows the speculation") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const auto draft = kvrun::test::shared_path("models/stories260K-Q8_0.gguf");
    const std::string input = "Once upon a time\nThe dog ran to the park\n/stats\n";
    auto plain = run_command(chat_cmd(model.string(), "--temp 0 -n 24"), input);
    auto spec = run_command(
        chat_cmd(model.string(), "--temp 0 -n 24 --draft-model " + draft.string() + " --draft-n 6"),
        input);
    REQUIRE(plain.exit_code == 0);
    REQUIRE(spec.exit_code == 0);
    // Replies (everything before the /stats block) are identical.
    CHECK(spec.out.substr(0, spec.out.find("conversation")) ==
          plain.out.substr(0, plain.out.find("conversation")));
    CHECK(spec.out.find("speculative    last turn") != std::string::npos);
    CHECK(spec.out.find("mean accepted length") != std::string::npos);
    CHECK(plain.out.find("speculative") == std::string::npos);
    auto help = run_command(kvrun::test::kvrun_binary() + " chat --help");
    CHECK(help.out.find("--draft-model") != std::string::npos);
    CHECK(help.out.find("--draft-n") != std::string::npos);
}

TEST_CASE("ChatSession with a grammar: every reply follows it, also across a mid-reply overflow") {
    using namespace kvrun;
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    ChatModel m(model.string(), 64);
    EngineOptions eo;
    eo.n_ctx = 160;
    Engine engine(*m.backend, *m.tok, eo);
    // A list: restarting the grammar in the middle would write " [" again.
    auto g = Grammar::parse(R"(root ::= " [" [a-z]+ (", " [a-z]+)* "]")");
    for (ContextOverflow policy : {ContextOverflow::Shift, ContextOverflow::Sinks}) {
        CAPTURE(int(policy));
        ChatConfig cfg;
        cfg.n_predict = 120;
        cfg.sampling.temperature = 0;
        cfg.overflow = policy;
        cfg.grammar = g;
        ChatSession chat(engine, *m.tok, cfg);
        Notices notes;
        for (const char* msg : {"Once upon a time", "The dog ran to the park"}) {
            std::string streamed;
            const std::string reply = chat.send(
                msg, [&](std::string_view t) { streamed += t; }, notes.sink());
            CAPTURE(reply);
            CHECK(streamed == reply);
            GrammarState st(g);
            CHECK(st.advance(" " + reply));  // the shown reply loses its leading space
            if (chat.last_turn().stop == StopReason::Eos) CHECK(st.complete());
        }
        // The second reply outgrew the context at least once and went on where it was.
        CHECK(chat.last_turn().n_overflows >= 1);
        CHECK(notes.has("[context full:"));
    }
}

TEST_CASE("chat -r/--reverse-prompt ends a reply before the text, like the template's stops") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    const std::string args = "--temp 0 -n 24 --system 'Tell a story.'";
    auto plain = run_command(chat_cmd(model.string(), args), "Once upon a time\n");
    REQUIRE(plain.exit_code == 0);
    const std::string reply = plain.out.substr(0, plain.out.find('\n'));
    // A word from the middle of the reply.
    const size_t mid = reply.find(' ', reply.size() / 2);
    REQUIRE(mid != std::string::npos);
    const size_t end = reply.find(' ', mid + 1);
    const std::string word = reply.substr(mid + 1, end == std::string::npos ? end : end - mid - 1);
    REQUIRE(word.size() >= 2);
    CAPTURE(reply);
    CAPTURE(word);
    auto cut = run_command(chat_cmd(model.string(), args + " -r " + shell_quote(word)),
                           "Once upon a time\n");
    REQUIRE(cut.exit_code == 0);
    const std::string short_reply = cut.out.substr(0, cut.out.find('\n'));
    CHECK(short_reply.size() < reply.size());
    CHECK(reply.rfind(short_reply, 0) == 0);  // a prefix of the uncut reply
    CHECK(short_reply.find(word) == std::string::npos);
    CHECK(reply.find(word) <= short_reply.size() + 1);
}

TEST_CASE("chat --prompt-cache: the next chat reuses the saved system prompt's blocks") {
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    kvrun::test::TempDir dir;
    const std::string args =
        "--temp 0 -n 10 --system " +
        shell_quote(
            "You are a friendly storyteller who tells short, happy stories about "
            "animals and children in a small village.") +
        " --prompt-cache " + dir.file("chat.cache");
    auto first = run_command(chat_cmd(model.string(), args), "Tell me a story\n/stats\n");
    REQUIRE_MESSAGE(first.exit_code == 0, first.err);
    CHECK(first.out.find("reused 0 cached tokens") != std::string::npos);
    auto second = run_command(chat_cmd(model.string(), args), "Tell me a story\n/stats\n");
    REQUIRE_MESSAGE(second.exit_code == 0, second.err);
    CHECK(second.out.find("reused 80 cached tokens") != std::string::npos);
    // The same reply either way.
    CHECK(second.out.substr(0, second.out.find('\n')) == first.out.substr(0, first.out.find('\n')));
}

TEST_CASE("ChatSession undo and regenerate: the conversation and its tokens go back exactly") {
    using namespace kvrun;
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    ChatModel m(model.string(), 64);
    Engine engine(*m.backend, *m.tok, EngineOptions{});
    ChatConfig cfg;
    cfg.system = "Tell a story.";
    cfg.n_predict = 20;
    cfg.sampling.temperature = 1.0f;
    cfg.sampling.seed = 5;
    cfg.ignore_eos = true;
    ChatSession chat(engine, *m.tok, cfg);
    Notices notes;
    CHECK_FALSE(chat.undo());  // nothing sent yet
    const std::string a1 = chat.send("Once upon a time", kIgnore, notes.sink());
    const std::vector<TokenId> after1 = chat.tokens();
    const auto messages1 = chat.messages();
    chat.send("Then what?", kIgnore, notes.sink());
    CHECK(chat.messages().size() == messages1.size() + 2);
    // Undo: the second exchange is gone, tokens and messages as after the first.
    REQUIRE(chat.undo());
    CHECK(chat.tokens() == after1);
    CHECK(chat.messages() == messages1);
    // Regenerate the first reply: a new draw (another seed), the same message before it.
    std::string shown;
    REQUIRE(chat.regenerate([&](std::string_view t) { shown += t; }, notes.sink()));
    CHECK(chat.messages().size() == messages1.size());
    CHECK(chat.messages()[messages1.size() - 2].content == "Once upon a time");
    const std::string a2 = chat.messages().back().content;
    CHECK(a2 != a1);
    CHECK(shown.find(a2.substr(0, 10)) != std::string::npos);
    // Greedy: regenerating gives the same reply again.
    ChatConfig greedy = cfg;
    greedy.sampling.temperature = 0;
    ChatSession g(engine, *m.tok, greedy);
    const std::string r1 = g.send("Once upon a time", kIgnore, notes.sink());
    const std::vector<TokenId> t1 = g.tokens();
    REQUIRE(g.regenerate(kIgnore, notes.sink()));
    CHECK(g.messages().back().content == r1);
    CHECK(g.tokens() == t1);
    // Both undone: back to the system prompt alone; a reset leaves nothing to undo.
    REQUIRE(g.undo());
    CHECK(g.n_tokens() == 0);
    CHECK(g.messages().size() == 1);
    CHECK_FALSE(g.undo());
    CHECK_FALSE(g.regenerate(kIgnore, notes.sink()));
    chat.reset();
    CHECK_FALSE(chat.undo());
}

TEST_CASE("ChatSession with a built-in thinking format keeps earlier replies without reasoning") {
    // Qwen 3 without --jinja (ChatML standing in for a template that thinks): a reply that
    // reasoned goes into the conversation as its answer alone, and the next message cuts the
    // sequence back to the reply's start and writes the answer again, so the tokens are the
    // conversation as the model's own template renders it. Undo and regenerate still work.
    using namespace kvrun;
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    ChatModel m(model.string(), 64);
    Engine engine(*m.backend, *m.tok, EngineOptions{});
    ChatConfig cfg;
    cfg.chat_template.kind = ChatTemplateKind::ChatML;
    cfg.chat_template.thinks = true;
    cfg.n_predict = 120;
    cfg.sampling.temperature = 0;
    cfg.grammar = Grammar::parse(R"(root ::= "<think>" [a-z ]{4,12} "</think>" [a-z ]{4,12})");
    ChatSession chat(engine, *m.tok, cfg);
    Notices notes;
    std::string shown;
    chat.send(
        "Once upon a time", [&](std::string_view t) { shown += t; }, notes.sink());
    CHECK(shown.find("<think>") != std::string::npos);  // the reply as generated
    const std::string answer = chat.messages().back().content;
    CHECK(answer.find("think") == std::string::npos);
    CHECK(!answer.empty());
    const auto messages1 = chat.messages();
    const std::vector<TokenId> after1 = chat.tokens();
    chat.send("Then what?", kIgnore, notes.sink());
    // The sequence up to the second reply is the answer-only conversation as rendered.
    std::vector<ChatMessage> convo = messages1;
    convo.push_back({"user", "Then what?"});
    std::string prompt =
        chat_template_apply(ChatTemplateKind::ChatML, convo, true, chat_special_texts(*m.tok));
    // (Compared as text without spaces: each turn's text is tokenized on its own, and this
    // SPM vocabulary puts a space before each piece of text it encodes.)
    auto no_spaces = [](std::string t) {
        t.erase(std::remove(t.begin(), t.end(), ' '), t.end());
        return t;
    };
    auto text_of = [&](const std::vector<TokenId>& ids) {
        std::string t;
        for (TokenId id : ids) t += m.tok->token_to_piece(id, true);
        return no_spaces(t);
    };
    prompt = no_spaces(prompt);
    std::string got = text_of(chat.tokens());
    CHECK_MESSAGE(got.find(prompt) != std::string::npos, got, "\n---\n", prompt);
    CHECK(chat.messages()[messages1.size() - 1].content == answer);
    // Undo: back to after the first exchange; the next message writes the answer again.
    REQUIRE(chat.undo());
    CHECK(chat.messages() == messages1);
    CHECK(chat.n_tokens() <= int32_t(after1.size()));
    chat.send("Then what?", kIgnore, notes.sink());
    got = text_of(chat.tokens());
    CHECK(got.find(prompt) != std::string::npos);
}

TEST_CASE("ChatSession: a reasoning budget goes on over a context overflow") {
    // A template that opens the reply's reasoning block (as DeepSeek R1's and Qwen 3's do).
    // The budget cuts the block once, whether the reply outgrows the context before the cut,
    // in the middle of the forced tokens or after them: the continued reply starts from
    // where the engine said the first request stopped.
    using namespace kvrun;
    auto model = kvrun::test::shared_path("models/stories260K.gguf");
    if (model.empty()) return;
    ChatModel m(model.string(), 64);
    EngineOptions eo;
    eo.n_ctx = 96;
    Engine engine(*m.backend, *m.tok, eo);
    ChatConfig cfg;
    cfg.chat_template.kind = ChatTemplateKind::ChatML;
    cfg.chat_template.jinja = std::make_shared<const JinjaTemplate>(JinjaTemplate::parse(
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
        "'<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif "
        "-%}"));
    cfg.chat_template.thinks = true;
    cfg.n_predict = 130;
    cfg.sampling.temperature = 0;
    cfg.ignore_eos = true;
    cfg.overflow = ContextOverflow::Sinks;
    cfg.reasoning_budget_message = " Done.";
    Notices notes;
    ChatConfig probe = cfg;
    probe.n_predict = 0;
    ChatSession p(engine, *m.tok, probe);
    p.send("Once upon a time", kIgnore, notes.sink());
    // About the reply tokens before the first overflow (the template's text after the
    // message, re-tokenized, makes it a few less): budgets around it cut before the overflow,
    // across it (forced tokens on both sides) and after it.
    const int32_t room = eo.n_ctx - p.n_tokens();
    REQUIRE(room > 14);
    auto count = [](const std::string& text, const std::string& what) {
        size_t n = 0;
        for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
            ++n;
        return n;
    };
    for (int32_t budget = room - 12; budget < room + 3; ++budget) {
        CAPTURE(budget);
        ChatConfig c = cfg;
        c.reasoning_budget = budget;
        ChatSession chat(engine, *m.tok, c);
        std::string shown;
        chat.send(
            "Once upon a time", [&](std::string_view t) { shown += t; }, notes.sink());
        CHECK(chat.last_turn().n_overflows >= 1);
        CHECK(chat.last_turn().n_generated == 130);
        CHECK(count(shown, "Done.</think>") == 1);
        CHECK(count(shown, "</think>") == 1);
        CHECK(count(shown, "Done") == 1);
    }
}
