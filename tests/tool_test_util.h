// Shared by the tool-calling tests: two tools with bounded arguments, and a check that a
// returned call names one of them with arguments that match its parameters.
#pragma once

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

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

}  // namespace kvrun::test
