// libFuzzer target for the Jinja interpreter, which renders templates from model files and
// --chat-template-file: the input is a template. Parsing must either succeed or throw
// kvrun::Error, and rendering a parsed template (a fixed chat, small limits) must either give
// text or throw kvrun::Error — never crash, hang or exhaust memory. Run with
// KVRUN_FUZZ_WRITE_SEEDS=<dir> to write a small seed corpus and exit.
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "common.h"
#include "fuzz_seeds.h"
#include "jinja.h"

namespace {

void write_seeds(const char* dir) {
    const char* seeds[] = {
        "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
        "'<|im_end|>\\n' }}{%- endfor -%}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}",
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% set ns = "
        "namespace(s=m.content) %}{% endif %}{{ m.content | trim | tojson(indent=2) }}"
        "{% endfor %}",
        "{% macro f(x, y=2) %}{{ x * y }}{% if x > 0 %}{{ f(x - 1) }}{% endif %}{% endmacro %}"
        "{{ f(3) }}{{ messages | map(attribute='role') | join(', ') }}",
        "{% for k, v in {'a': [1, 2.5, none], 'b': 'x'}.items() if k != 'c' %}{{ loop.index }}"
        "{{ k ~ v | string }}{% else %}empty{% endfor %}{{ 'abc'[::-1] }}{{ 7 // 2 }}",
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('users first') }}{% endif %}"
        "{{ messages[-1].content.split(' ')[0] | upper }}{% raw %}{{ x }}{% endraw %}",
    };
    int n = 0;
    for (const char* s : seeds)
        std::ofstream(std::string(dir) + "/seed_" + std::to_string(n++), std::ios::binary) << s;
}

const nlohmann::ordered_json& context() {
    static const nlohmann::ordered_json c = {
        {"messages",
         {{{"role", "system"}, {"content", "You are terse."}},
          {{"role", "user"}, {"content", "Hi there"}},
          {{"role", "assistant"}, {"content", "Hello! <think>x</think> ok"}},
          {{"role", "user"}, {"content", "héllo 世界"}}}},
        {"add_generation_prompt", true},
        {"bos_token", "<s>"},
        {"eos_token", "</s>"},
        {"tools", nullptr}};
    return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    return fuzz_write_seeds_if_asked(write_seeds);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view source(reinterpret_cast<const char*>(data), size);
    try {
        const kvrun::JinjaTemplate t = kvrun::JinjaTemplate::parse(source);
        kvrun::JinjaTemplate::Limits limits;
        limits.max_steps = 20000;
        limits.max_output = size_t(1) << 20;
        (void)t.render(context(), limits);
    } catch (const kvrun::Error&) {
        // a clear error is an allowed outcome
    }
    return 0;
}
