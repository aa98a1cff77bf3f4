// A self-contained Jinja2 interpreter for the chat templates GGUF models carry
// (`tokenizer.chat_template`), rendering them the way Hugging Face transformers'
// apply_chat_template does: a jinja2 environment with trim_blocks, lstrip_blocks and the
// loopcontrols extension, plus the globals raise_exception(msg) and strftime_now(fmt) and
// HF's tojson filter (json.dumps with ensure_ascii=False, so ", " and ": " separators).
//
// Values follow Python: missing variables and attributes are "undefined" (render as "",
// falsy, `is defined` false); attribute access on an undefined value is an error, as in
// jinja2. Hostile templates raise kvrun::Error (never crash or hang): nesting depth, macro
// recursion, loop iterations and output size are bounded (Limits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kvrun {

namespace jinja {
struct Program;  // the parsed tree (jinja_impl.h)
}

class JinjaTemplate {
  public:
    // Bounds that keep a hostile template from exhausting the stack, memory or time.
    struct Limits {
        // Nesting of expressions and blocks at parse time (the parse uses the default);
        // at render time, 5x this in nested evaluation frames (macro recursion included).
        int max_depth = 200;
        // Loop iterations, function / macro calls and filters, all together.
        uint64_t max_steps = 10'000'000;
        // Bytes of the output and of any string built (a list counts about 100 bytes an
        // item); values built in total may reach 64x this before the render is stopped.
        size_t max_output = size_t(64) << 20;
    };

    // Parses `source`. Throws kvrun::Error "line L, column C: what" for a syntax error
    // (including an unknown filter or test name).
    static JinjaTemplate parse(std::string_view source);

    // Renders with `context`, an object whose members become the template's variables
    // (messages, add_generation_prompt, bos_token, eos_token, tools, ...). Throws
    // kvrun::Error for a runtime error ("line L, column C: what"); raise_exception(msg)
    // throws an Error whose what() is exactly msg.
    std::string render(const nlohmann::ordered_json& context) const;
    std::string render(const nlohmann::ordered_json& context, const Limits& limits) const;

    const std::string& source() const;

  private:
    std::shared_ptr<const jinja::Program> program_;
};

// JSON text as a template's tojson writes it (Python's json.dumps: ", " and ": " separators;
// with indent > 0, one item a line): what a model's templates saw in training.
std::string jinja_tojson(const nlohmann::ordered_json& value, int indent = 0);

}  // namespace kvrun
