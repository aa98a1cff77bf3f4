// Shared by the tool-calling tests: two tools with bounded arguments, and a check that a
// returned call names one of them with arguments that match its parameters.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gguf.h"
#include "gguf_writer.h"

namespace kvrun::test {

// Two tools whose arguments are bounded (a short string, an enum, integers), so even a tiny
// model's constrained reply ends.
inline nlohmann::ordered_json weather_and_add() {
    return nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 12},
                         "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"]}}},
      {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object",
          "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                         "b": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["a", "b"]}}}
    ])");
}

// A call's arguments must parse and match its tool's parameters.
inline void check_call(const nlohmann::json& call, const std::set<std::string>& names) {
    CHECK(call["type"] == "function");
    CHECK(call["id"].is_string());
    const std::string name = call["function"]["name"];
    CHECK(names.count(name) == 1);
    const nlohmann::json args =
        nlohmann::json::parse(call["function"]["arguments"].get<std::string>());
    if (name == "get_weather") {
        CHECK(args["city"].is_string());
        CHECK(args["city"].get<std::string>().size() <= 12);
        CHECK((args["unit"] == "celsius" || args["unit"] == "fahrenheit"));
    } else {
        CHECK(args["a"].is_number_integer());
        CHECK(args["b"].is_number_integer());
        CHECK(args["a"].get<int>() <= 999);
    }
}

// A copy of the model at `path` (in the temp directory, as `name`) with some of its tokens
// renamed (from, to) and made control tokens (or of another `type`): tool syntaxes with real
// control tokens on a model that runs here (byte tokens its stories never use).
inline std::string with_control_tokens(
    const std::string& path, const std::vector<std::pair<const char*, const char*>>& renamed,
    const std::string& name, int32_t type = 3 /* control; 1: normal */) {
    GgufFile in = GgufFile::open(path);
    GgufWriter w(static_cast<uint32_t>(in.alignment()));
    for (const auto& [key, value] : in.metadata()) w.set_value(key, value);
    std::vector<std::string> tokens;
    for (const GgufValue& v : in.get_array("tokenizer.ggml.tokens"))
        tokens.push_back(v.as_string());
    std::vector<int32_t> types;
    for (const GgufValue& v : in.get_array("tokenizer.ggml.token_type"))
        types.push_back(static_cast<int32_t>(v.as_int()));
    for (const auto& [from, to] : renamed) {
        const auto it = std::find(tokens.begin(), tokens.end(), from);
        REQUIRE(it != tokens.end());
        *it = to;
        types[static_cast<size_t>(it - tokens.begin())] = type;
    }
    w.set_array_str("tokenizer.ggml.tokens", tokens);
    w.set_array_i32("tokenizer.ggml.token_type", types);
    for (const GgufTensorInfo& t : in.tensors())
        w.add_tensor(t.name, t.type, t.dims, t.data, t.n_bytes);
    const std::string out = (std::filesystem::temp_directory_path() / name).string();
    w.write_file(out);
    return out;
}

}  // namespace kvrun::test
