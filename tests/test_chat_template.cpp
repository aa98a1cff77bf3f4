// Tests for chat templates: exact text of every format, detection from Jinja sources, names,
// and the prefix properties that incremental chat relies on.
#include <cstring>
#include <fstream>
#include <iterator>

#include "chat_template.h"
#include "common.h"
#include "jinja.h"
#include "test_util.h"

using namespace kvrun;

namespace {

const std::vector<ChatTemplateKind> kAllKinds = {ChatTemplateKind::Llama2,
                                                 ChatTemplateKind::Llama3,
                                                 ChatTemplateKind::ChatML,
                                                 ChatTemplateKind::Mistral,
                                                 ChatTemplateKind::Zephyr,
                                                 ChatTemplateKind::Phi3,
                                                 ChatTemplateKind::Phi4,
                                                 ChatTemplateKind::Gemma,
                                                 ChatTemplateKind::Granite,
                                                 ChatTemplateKind::DeepSeek3,
                                                 ChatTemplateKind::DeepSeek2,
                                                 ChatTemplateKind::MistralV3,
                                                 ChatTemplateKind::MistralV3Tekken,
                                                 ChatTemplateKind::MistralV7,
                                                 ChatTemplateKind::MistralV7Tekken,
                                                 ChatTemplateKind::Plain};

// system + user + assistant + user, the conversation every format is checked on.
std::vector<ChatMessage> four_turns() {
    return {{"system", "You are terse."},
            {"user", "Hi there"},
            {"assistant", "Hello! How can I help?"},
            {"user", "Tell me a joke."}};
}

std::string expected_four_turns(ChatTemplateKind kind) {
    switch (kind) {
        case ChatTemplateKind::Llama2:
            return "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! How can "
                   "I help? </s><s>[INST] Tell me a joke. [/INST]";
        case ChatTemplateKind::Llama3:
            return "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I "
                   "help?<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n";
        case ChatTemplateKind::ChatML:
            return "<|im_start|>system\nYou are terse.<|im_end|>\n"
                   "<|im_start|>user\nHi there<|im_end|>\n"
                   "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
                   "<|im_start|>user\nTell me a joke.<|im_end|>\n"
                   "<|im_start|>assistant\n";
        case ChatTemplateKind::Mistral:
            return "[INST] You are terse.\n\nHi there [/INST]Hello! How can I help?</s>"
                   "[INST] Tell me a joke. [/INST]";
        case ChatTemplateKind::Zephyr:
            return "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n"
                   "<|assistant|>\nHello! How can I help?</s>\n"
                   "<|user|>\nTell me a joke.</s>\n<|assistant|>\n";
        case ChatTemplateKind::Phi3:
            return "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n"
                   "<|assistant|>\nHello! How can I help?<|end|>\n"
                   "<|user|>\nTell me a joke.<|end|>\n<|assistant|>\n";
        case ChatTemplateKind::Phi4:
            return "<|im_start|>system<|im_sep|>You are terse.<|im_end|>"
                   "<|im_start|>user<|im_sep|>Hi there<|im_end|>"
                   "<|im_start|>assistant<|im_sep|>Hello! How can I help?<|im_end|>"
                   "<|im_start|>user<|im_sep|>Tell me a joke.<|im_end|>"
                   "<|im_start|>assistant<|im_sep|>";
        case ChatTemplateKind::Gemma:
            return "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
                   "<start_of_turn>model\nHello! How can I help?<end_of_turn>\n"
                   "<start_of_turn>user\nTell me a joke.<end_of_turn>\n"
                   "<start_of_turn>model\n";
        case ChatTemplateKind::Granite:
            return "<|start_of_role|>system<|end_of_role|>You are terse.<|end_of_text|>\n"
                   "<|start_of_role|>user<|end_of_role|>Hi there<|end_of_text|>\n"
                   "<|start_of_role|>assistant<|end_of_role|>Hello! How can I "
                   "help?<|end_of_text|>\n"
                   "<|start_of_role|>user<|end_of_role|>Tell me a joke.<|end_of_text|>\n"
                   "<|start_of_role|>assistant<|end_of_role|>";
        case ChatTemplateKind::DeepSeek3:
            return "You are terse.\n\n<\uFF5CUser\uFF5C>Hi there<\uFF5CAssistant\uFF5C>Hello! How "
                   "can I help?<\uFF5Cend\u2581of\u2581sentence\uFF5C><\uFF5CUser\uFF5C>Tell me a "
                   "joke.<\uFF5CAssistant\uFF5C>";
        case ChatTemplateKind::DeepSeek2:
            return "You are terse.\n\nUser: Hi there\n\nAssistant: Hello! How can I "
                   "help?<\uFF5Cend\u2581of\u2581sentence\uFF5C>User: Tell me a "
                   "joke.\n\nAssistant:";
        case ChatTemplateKind::MistralV3:
            return "[INST] You are terse.\n\nHi there[/INST] Hello! How can I help?</s>"
                   "[INST] Tell me a joke.[/INST]";
        case ChatTemplateKind::MistralV3Tekken:
            return "[INST]You are terse.\n\nHi there[/INST]Hello! How can I help?</s>"
                   "[INST]Tell me a joke.[/INST]";
        case ChatTemplateKind::MistralV7:
            return "[SYSTEM_PROMPT] You are terse.[/SYSTEM_PROMPT][INST] Hi there[/INST] Hello! "
                   "How can I help?</s>[INST] Tell me a joke.[/INST]";
        case ChatTemplateKind::MistralV7Tekken:
            return "[SYSTEM_PROMPT]You are terse.[/SYSTEM_PROMPT][INST]Hi there[/INST]Hello! "
                   "How can I help?</s>[INST]Tell me a joke.[/INST]";
        case ChatTemplateKind::Plain:
            return "You are terse.\n\nUser: Hi there\nAssistant: Hello! How can I help?\n"
                   "User: Tell me a joke.\nAssistant:";
    }
    return {};
}

// Conversations of assorted shapes for the prefix properties.
std::vector<std::vector<ChatMessage>> assorted_conversations() {
    return {
        four_turns(),
        {{"user", "  padded question \n"},
         {"assistant", "\n answer with spaces  "},
         {"user", "again"},
         {"assistant", "sure"}},
        {{"system", ""}, {"user", "empty system"}, {"assistant", "ok"}},
        {{"user", "a"},
         {"user", "b"},
         {"assistant", "c"},
         {"system", "late system"},
         {"user", "d"}},
        {{"system", "sys"}, {"assistant", "starts with a reply"}, {"user", "then a user"}},
        {{"user", "unicode: héllo → 世界 🙂"}, {"assistant", "ça va"}},
    };
}

// The value of tokenizer.chat_template in a GGUF file, found by its key bytes (a GGUF string
// value: u32 type 8, u64 length, bytes). Empty when absent.
std::string raw_chat_template(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string key = "tokenizer.chat_template";
    size_t at = data.find(key);
    if (at == std::string::npos || at + key.size() + 12 > data.size()) return {};
    size_t p = at + key.size();
    uint32_t type = 0;
    uint64_t len = 0;
    std::memcpy(&type, data.data() + p, 4);
    std::memcpy(&len, data.data() + p + 4, 8);
    if (type != 8 || len > data.size() - p - 12) return {};
    return data.substr(p + 12, len);
}

}  // namespace

TEST_CASE("every format renders system + user + assistant + user exactly") {
    for (ChatTemplateKind kind : kAllKinds) {
        CAPTURE(chat_template_name(kind));
        CHECK(chat_template_apply(kind, four_turns(), true) == expected_four_turns(kind));
    }
}

TEST_CASE("without a generation prompt the last user turn stands alone") {
    auto msgs = four_turns();
    CHECK(chat_template_apply(ChatTemplateKind::ChatML, msgs, false) ==
          "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi "
          "there<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
          "<|im_start|>user\nTell me a joke.<|im_end|>\n");
    // [/INST] already asks for the reply, so Llama-2 and Mistral add nothing.
    CHECK(chat_template_apply(ChatTemplateKind::Llama2, msgs, false) ==
          chat_template_apply(ChatTemplateKind::Llama2, msgs, true));
    CHECK(chat_template_apply(ChatTemplateKind::Gemma, msgs, false) ==
          "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
          "Hello! How can I help?<end_of_turn>\n<start_of_turn>user\nTell me a "
          "joke.<end_of_turn>\n");
}

TEST_CASE("formats without a system message, and trimming") {
    std::vector<ChatMessage> msgs = {{"user", "  Hi \n"}, {"assistant", " Yo  "}, {"user", "x"}};
    CHECK(chat_template_apply(ChatTemplateKind::Llama2, msgs, true) ==
          "[INST] Hi [/INST] Yo </s><s>[INST] x [/INST]");
    CHECK(chat_template_apply(ChatTemplateKind::Llama3, msgs, false) ==
          "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>");
    CHECK(chat_template_apply(ChatTemplateKind::Gemma, msgs, true) ==
          "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"
          "<start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n");
    // ChatML, Mistral, Zephyr and Phi-3 keep content verbatim.
    CHECK(chat_template_apply(ChatTemplateKind::Mistral, msgs, true) ==
          "[INST]   Hi \n [/INST] Yo  </s>[INST] x [/INST]");
    CHECK(chat_template_apply(ChatTemplateKind::ChatML, {{"user", " a "}}, true) ==
          "<|im_start|>user\n a <|im_end|>\n<|im_start|>assistant\n");
    CHECK(chat_template_apply(ChatTemplateKind::Plain, {{"user", "q"}}, true) ==
          "User: q\nAssistant:");
    CHECK(chat_template_apply(ChatTemplateKind::Llama3, {}, true) ==
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("vocabulary-specific BOS/EOS texts") {
    ChatSpecialTexts special{"<|bos|>", "<|endoftext|>"};
    std::vector<ChatMessage> msgs = {{"user", "u"}, {"assistant", "a"}, {"user", "v"}};
    CHECK(chat_template_apply(ChatTemplateKind::Zephyr, msgs, true, special) ==
          "<|user|>\nu<|endoftext|>\n<|assistant|>\na<|endoftext|>\n<|user|>\nv<|endoftext|>\n"
          "<|assistant|>\n");
    CHECK(chat_template_apply(ChatTemplateKind::Llama2, msgs, true, special) ==
          "[INST] u [/INST] a <|endoftext|><|bos|>[INST] v [/INST]");
    CHECK(chat_template_assistant_suffix(ChatTemplateKind::Zephyr, special) == "<|endoftext|>\n");
}

TEST_CASE("a late system message is a user turn where the format has no system role") {
    std::vector<ChatMessage> msgs = {{"user", "a"}, {"system", "s"}};
    CHECK(chat_template_apply(ChatTemplateKind::Gemma, msgs, false) ==
          "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>user\ns<end_of_turn>\n");
    CHECK(chat_template_apply(ChatTemplateKind::ChatML, msgs, false) ==
          "<|im_start|>user\na<|im_end|>\n<|im_start|>system\ns<|im_end|>\n");
}

TEST_CASE("prefix extension: apply(history) starts every longer conversation") {
    for (ChatTemplateKind kind : kAllKinds) {
        CAPTURE(chat_template_name(kind));
        for (const auto& conv : assorted_conversations()) {
            for (size_t n = 0; n < conv.size(); ++n) {
                std::vector<ChatMessage> history(conv.begin(), conv.begin() + n);
                std::string prefix = chat_template_apply(kind, history, false);
                for (bool gen : {false, true}) {
                    std::vector<ChatMessage> longer(conv.begin(), conv.begin() + n + 1);
                    std::string full = chat_template_apply(kind, longer, gen);
                    CAPTURE(n);
                    CHECK(full.substr(0, prefix.size()) == prefix);
                }
                // The delta is exactly the rest.
                std::string delta = chat_template_apply_delta(kind, history, conv[n]);
                std::vector<ChatMessage> longer(conv.begin(), conv.begin() + n + 1);
                CHECK(prefix + delta == chat_template_apply(kind, longer, true));
            }
        }
    }
}

TEST_CASE("the reply fits: generation prompt + reply + suffix = the closed conversation") {
    for (ChatTemplateKind kind : kAllKinds) {
        CAPTURE(chat_template_name(kind));
        for (auto conv : assorted_conversations()) {
            if (conv.back().role == "assistant") conv.pop_back();
            std::string prompt = chat_template_apply(kind, conv, true);
            conv.push_back({"assistant", "Reply text."});
            std::string closed = chat_template_apply(kind, conv, false);
            REQUIRE(closed.substr(0, prompt.size()) == prompt);
            // What the model generates after the prompt, then the turn's closing text.
            std::string generated = closed.substr(prompt.size());
            std::string suffix = chat_template_assistant_suffix(kind);
            REQUIRE(generated.size() >= suffix.size());
            CHECK(generated.substr(generated.size() - suffix.size()) == suffix);
            std::string body = generated.substr(0, generated.size() - suffix.size());
            CHECK((body == "Reply text." || body == " Reply text."));
        }
    }
}

TEST_CASE("incremental chat: the delta after a reply for the next user message") {
    std::vector<ChatMessage> history = {four_turns()[0], four_turns()[1], four_turns()[2]};
    ChatMessage next = four_turns()[3];
    CHECK(chat_template_apply_delta(ChatTemplateKind::ChatML, history, next) ==
          "<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n");
    CHECK(chat_template_apply_delta(ChatTemplateKind::Llama2, history, next) ==
          "<s>[INST] Tell me a joke. [/INST]");
    CHECK(chat_template_apply_delta(ChatTemplateKind::Llama3, {}, {"user", "hi"}) ==
          "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    // The first delta of a Llama-2 chat with a system prompt carries the <<SYS>> block.
    CHECK(chat_template_apply_delta(ChatTemplateKind::Llama2, {{"system", "S"}}, {"user", "U"}) ==
          "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]");
}

TEST_CASE("detection from real-world Jinja templates") {
    const std::string llama2 =
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
        "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
        "{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
        "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
        "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 "
        "== 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
        "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
        "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
        "content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + "
        "content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
    const std::string llama3 =
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
        "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
        "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
        "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
    const std::string chatml_qwen =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    const std::string mistral =
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
        "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
        "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
        "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only "
        "user and assistant roles are supported!') }}{% endif %}{% endfor %}";
    const std::string zephyr =
        "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
        "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
        "'<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
        "'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
        "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
        "{% endfor %}";
    const std::string zephyr_literal_eos =
        "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + "
        "'</s>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";
    const std::string phi3 =
        "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
        "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if "
        "add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
    const std::string gemma =
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
        "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
        "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
        "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
        "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{'<start_of_turn>model\n'}}{% endif %}";
    const std::string phi4 =
        "{% for message in messages %}{% if (message['role'] == 'system') %}"
        "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif "
        "(message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + "
        "'<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant"
        "<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if "
        "add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}";
    // IBM Granite 3's template (abridged: the default system prompt and tools elided).
    const std::string granite =
        "{%- for message in loop_messages %}{{- '<|start_of_role|>' + message['role'] + "
        "'<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}{%- if loop.last and "
        "add_generation_prompt %}{{- '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif "
        "%}{%- endfor %}";
    const std::string vicuna =
        "{% for message in messages %}{% if message['role'] == 'user' %}{{ 'USER: ' + "
        "message['content'] + ' ' }}{% else %}{{ 'ASSISTANT: ' + message['content'] + eos_token "
        "}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

    CHECK(chat_template_detect(llama2) == ChatTemplateKind::Llama2);
    CHECK(chat_template_detect(llama3) == ChatTemplateKind::Llama3);
    CHECK(chat_template_detect(chatml_qwen) == ChatTemplateKind::ChatML);
    CHECK(chat_template_detect(mistral) == ChatTemplateKind::Mistral);
    CHECK(chat_template_detect(zephyr) == ChatTemplateKind::Zephyr);
    CHECK(chat_template_detect(zephyr_literal_eos) == ChatTemplateKind::Zephyr);
    CHECK(chat_template_detect(phi3) == ChatTemplateKind::Phi3);
    CHECK(chat_template_detect(gemma) == ChatTemplateKind::Gemma);
    CHECK(chat_template_detect(phi4) == ChatTemplateKind::Phi4);
    CHECK(chat_template_detect(granite) == ChatTemplateKind::Granite);
    // DeepSeek R1 (abridged: the think-stripping of earlier replies elided).
    const std::string deepseek_r1 =
        "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
        "{% endif %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if "
        "message['role'] == 'user' %}{{'<\uFF5CUser\uFF5C>' + message['content']}}{%- endif %}"
        "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
        "{{'<\uFF5CAssistant\uFF5C>' + content + '<\uFF5Cend\u2581of\u2581sentence\uFF5C>'}}"
        "{%- endif %}{%- endfor %}{% if add_generation_prompt %}{{'<\uFF5CAssistant\uFF5C>'}}"
        "{% endif %}";
    // Mistral's templates (abridged to their markers): Small 3 (v7 Tekken), Large 2411 (v7),
    // Nemo (v3 Tekken), 7B v0.3 (v3).
    const std::string mistral_small3 =
        "{{- bos_token }}{%- if system_message is defined %}{{- '[SYSTEM_PROMPT]' + "
        "system_message + '[/SYSTEM_PROMPT]' }}{%- endif %}{%- for message in loop_messages %}"
        "{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}"
        "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}{%- "
        "endif %}{%- endfor %}";
    const std::string mistral_large2411 =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif "
        "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% endif %}"
        "{% endfor %}";
    const std::string mistral_nemo =
        "{%- if messages[0][\"role\"] == \"system\" %}{%- set system_message = "
        "messages[0][\"content\"] %}{%- endif %}{{- bos_token }}{%- for message in "
        "loop_messages %}{%- if message[\"role\"] == \"user\" %}{%- if tools is not none and "
        "(message == user_messages[-1]) %}{{- \"[AVAILABLE_TOOLS][\" }}{%- endif %}{{- "
        "\"[INST]\" + message[\"content\"] + \"[/INST]\" }}{%- endif %}{%- endfor %}";
    const std::string mistral_v03 =
        "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
        "{%- if tools is not none %}{{- '[AVAILABLE_TOOLS] [' }}{%- endif %}{{- '[INST] ' + "
        "message['content'] + '[/INST]' }}{%- endif %}{%- endfor %}";
    CHECK(chat_template_detect(deepseek_r1) == ChatTemplateKind::DeepSeek3);
    // DeepSeek V2 (-Lite) Chat's template; its text for the four turns is the built-in's.
    const std::string deepseek_v2 =
        "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
        "{% endif %}{{ bos_token }}{% for message in messages %}{% if message['role'] == "
        "'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == "
        "'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% elif "
        "message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor "
        "%}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
    CHECK(chat_template_detect(deepseek_v2) == ChatTemplateKind::DeepSeek2);
    const ChatSpecialTexts ds{"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"};
    CHECK(chat_template_apply_jinja(JinjaTemplate::parse(deepseek_v2), four_turns(), true, ds) ==
          chat_template_apply(ChatTemplateKind::DeepSeek2, four_turns(), true, ds));
    CHECK(chat_template_detect(mistral_small3) == ChatTemplateKind::MistralV7Tekken);
    CHECK(chat_template_detect(mistral_large2411) == ChatTemplateKind::MistralV7);
    CHECK(chat_template_detect(mistral_nemo) == ChatTemplateKind::MistralV3Tekken);
    CHECK(chat_template_detect(mistral_v03) == ChatTemplateKind::MistralV3);
    CHECK(chat_template_detect(vicuna) == ChatTemplateKind::Plain);
    CHECK(chat_template_detect("") == ChatTemplateKind::Plain);
}

TEST_CASE("detection of the Phi-3 template stored in a real GGUF vocabulary") {
    auto path = kvrun::test::shared_path("vocab/ggml-vocab-phi-3.gguf");
    if (path.empty()) return;
    std::string jinja = raw_chat_template(path);
    REQUIRE_FALSE(jinja.empty());
    CHECK(chat_template_detect(jinja) == ChatTemplateKind::Phi3);
}

TEST_CASE("names: canonical, aliases, case, round trip, and the unknown-name error") {
    for (ChatTemplateKind kind : kAllKinds) {
        CHECK(chat_template_from_name(chat_template_name(kind)) == kind);
    }
    CHECK(chat_template_name(ChatTemplateKind::ChatML) == "chatml");
    CHECK(chat_template_from_name("llama-2") == ChatTemplateKind::Llama2);
    CHECK(chat_template_from_name("llama-3") == ChatTemplateKind::Llama3);
    CHECK(chat_template_from_name("phi-3") == ChatTemplateKind::Phi3);
    CHECK(chat_template_from_name("phi-4") == ChatTemplateKind::Phi4);
    CHECK(chat_template_from_name("ChatML") == ChatTemplateKind::ChatML);
    try {
        chat_template_from_name("vicuna");
        FAIL("expected an Error");
    } catch (const Error& e) {
        std::string msg = e.what();
        CHECK(msg.find("'vicuna'") != std::string::npos);
        CHECK(msg.find("llama2, llama3, chatml, mistral, zephyr, phi3, phi4, gemma, granite, "
                       "deepseek3, deepseek2, mistral-v3, mistral-v3-tekken, mistral-v7, "
                       "mistral-v7-tekken, plain") != std::string::npos);
    }
    CHECK_THROWS_AS(chat_template_from_name(""), Error);
}

TEST_CASE("an unknown role is an Error naming the message") {
    std::vector<ChatMessage> msgs = {{"user", "a"}, {"tool", "b"}};
    for (ChatTemplateKind kind : kAllKinds) {
        CHECK_THROWS_WITH_AS(chat_template_apply(kind, msgs, true),
                             "chat message 1: unknown role 'tool' (expected system, user or "
                             "assistant)",
                             Error);
    }
}

TEST_CASE("stop strings and assistant suffixes") {
    CHECK(chat_template_stop_strings(ChatTemplateKind::ChatML).front() == "<|im_end|>");
    CHECK(chat_template_stop_strings(ChatTemplateKind::Llama3).front() == "<|eot_id|>");
    CHECK(chat_template_stop_strings(ChatTemplateKind::Phi3).front() == "<|end|>");
    CHECK(chat_template_stop_strings(ChatTemplateKind::Gemma).front() == "<end_of_turn>");
    CHECK(chat_template_stop_strings(ChatTemplateKind::Llama2).front() == "</s>");
    CHECK(chat_template_stop_strings(ChatTemplateKind::DeepSeek3).front() ==
          "<\uFF5Cend\u2581of\u2581sentence\uFF5C>");
    CHECK(chat_template_stop_strings(ChatTemplateKind::MistralV7Tekken).front() == "</s>");
    // The Mistral formats close a reply with the vocabulary's EOS text.
    CHECK(chat_template_apply(ChatTemplateKind::MistralV7Tekken,
                              {{"user", "u"}, {"assistant", "a"}, {"user", "v"}}, true,
                              {"<s>", "<eos>"}) == "[INST]u[/INST]a<eos>[INST]v[/INST]");
    CHECK(chat_template_apply(ChatTemplateKind::MistralV3, {{"user", "u"}, {"assistant", " a\n"}},
                              false) == "[INST] u[/INST] a</s>");  // v3 trims the reply
    for (ChatTemplateKind kind : kAllKinds) {
        CAPTURE(chat_template_name(kind));
        CHECK_FALSE(chat_template_stop_strings(kind).empty());
        // The suffix holds the first stop string (it is what ends the turn), except Plain
        // whose stop string marks the start of the next turn.
        if (kind != ChatTemplateKind::Plain) {
            std::string suffix = chat_template_assistant_suffix(kind);
            CHECK(suffix.find(chat_template_stop_strings(kind).front()) != std::string::npos);
        }
    }
}
