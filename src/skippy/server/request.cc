#include "skippy/server/request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>

#include "skippy/common/strings.h"
#include "skippy/server/api_error.h"

namespace skippy::server {

using nlohmann::json;

namespace {

Status TypeError(std::string_view field, std::string_view want) {
  return absl::InvalidArgumentError(StrCat("field '", field, "' must be ", want));
}

const json* Get(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

StatusOr<std::optional<int64_t>> GetInt(const json& body, const char* key) {
  const json* v = Get(body, key);
  if (!v) return std::optional<int64_t>();
  if (v->is_number_integer() || v->is_number_unsigned()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) return TypeError(key, "an integer in range");
    return std::optional<int64_t>(v->get<int64_t>());
  }
  // 8.0 is accepted as 8 (some clients send floats), 8.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    // Range first: converting a double outside int64's range is undefined behaviour.
    if (d > -1e15 && d < 1e15 && d == static_cast<double>(static_cast<int64_t>(d))) {
      return std::optional<int64_t>(static_cast<int64_t>(d));
    }
  }
  return TypeError(key, "an integer");
}

StatusOr<std::optional<double>> GetNumber(const json& body, const char* key) {
  const json* v = Get(body, key);
  if (!v) return std::optional<double>();
  if (!v->is_number()) return TypeError(key, "a number");
  return std::optional<double>(v->get<double>());
}

StatusOr<std::optional<bool>> GetBool(const json& body, const char* key) {
  const json* v = Get(body, key);
  if (!v) return std::optional<bool>();
  if (!v->is_boolean()) return TypeError(key, "a boolean");
  return std::optional<bool>(v->get<bool>());
}

StatusOr<std::optional<std::string>> GetString(const json& body, const char* key) {
  const json* v = Get(body, key);
  if (!v) return std::optional<std::string>();
  if (!v->is_string()) return TypeError(key, "a string");
  return std::optional<std::string>(v->get<std::string>());
}

StatusOr<std::vector<runtime::Token>> TokenArray(const json& arr, std::string_view field) {
  std::vector<runtime::Token> out;
  out.reserve(arr.size());
  for (const json& t : arr) {
    if (!t.is_number_integer() && !t.is_number_unsigned()) return TypeError(field, "an array of integer token ids");
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v > INT32_MAX) return absl::InvalidArgumentError(StrCat("token id ", v, " in '", field, "' is out of range"));
    out.push_back(static_cast<runtime::Token>(v));
  }
  return out;
}

Status ParsePrompt(const json& p, GenerationRequest& r) {
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
    return absl::OkStatus();
  }
  if (!p.is_array()) return TypeError("prompt", "a string, an array of token ids, or a one-element array");
  if (p.empty()) return absl::InvalidArgumentError("field 'prompt' is empty");
  if (p[0].is_number()) {
    SKIPPY_ASSIGN_OR_RETURN(r.prompt_tokens, TokenArray(p, "prompt"));
    return absl::OkStatus();
  }
  if (p.size() != 1) return absl::InvalidArgumentError("batched prompts are not supported: send one prompt per request");
  if (p[0].is_string()) {
    r.prompt_text = p[0].get<std::string>();
    return absl::OkStatus();
  }
  if (p[0].is_array()) {
    SKIPPY_ASSIGN_OR_RETURN(r.prompt_tokens, TokenArray(p[0], "prompt"));
    return absl::OkStatus();
  }
  return TypeError("prompt", "a string, an array of token ids, or a one-element array");
}

// OpenAI's function names: 1-64 letters, digits, underscores and dashes. They reach the chat
// template and the tool grammar's rules and trigger patterns.
bool ValidToolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
}

// A message's tool fields: an assistant's tool_calls ([{id, type: "function", function: {name,
// arguments}}]) and reasoning_content (as llama-server answers it, sent back), a tool result's
// tool_call_id, and name (a tool result's tool).
Status ParseToolFields(const json& msg, size_t i, const RequestLimits& limits, runtime::ChatMessage& cm) {
  const std::string at = StrCat("messages[", i, "]");
  SKIPPY_ASSIGN_OR_RETURN(auto reasoning, GetString(msg, "reasoning_content"));
  cm.reasoning_content = reasoning.value_or("");
  if (reasoning && cm.role != "assistant") {
    return absl::InvalidArgumentError(StrCat(at, ": reasoning_content belongs to an assistant message"));
  }
  SKIPPY_ASSIGN_OR_RETURN(auto name, GetString(msg, "name"));
  cm.name = name.value_or("");
  SKIPPY_ASSIGN_OR_RETURN(auto call_id, GetString(msg, "tool_call_id"));
  cm.tool_call_id = call_id.value_or("");
  if (call_id && cm.role != "tool") return absl::InvalidArgumentError(StrCat(at, ": tool_call_id belongs to a tool message"));
  const json* calls = Get(msg, "tool_calls");
  if (!calls) return absl::OkStatus();
  if (!calls->is_array()) return TypeError(StrCat(at, ".tool_calls"), "an array");
  if (!calls->empty() && cm.role != "assistant") {
    return absl::InvalidArgumentError(StrCat(at, ": only an assistant message has tool_calls"));
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string field = StrCat(at, ".tool_calls[", k, "]");
    if (!c.is_object()) return TypeError(field, "an object");
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (it.key() != "id" && it.key() != "type" && it.key() != "function" && it.key() != "index" && !it->is_null()) {
        return absl::InvalidArgumentError(StrCat(field, ": unsupported field '", it.key(), "'"));
      }
    }
    SKIPPY_ASSIGN_OR_RETURN(auto type, GetString(c, "type"));
    if (type && *type != "function") return absl::InvalidArgumentError(StrCat(field, ".type must be \"function\""));
    SKIPPY_ASSIGN_OR_RETURN(auto id, GetString(c, "id"));
    const json* f = Get(c, "function");
    if (!f || !f->is_object()) return TypeError(StrCat(field, ".function"), "an object with name and arguments");
    for (auto it = f->begin(); it != f->end(); ++it) {
      if (it.key() != "name" && it.key() != "arguments" && !it->is_null()) {
        return absl::InvalidArgumentError(StrCat(field, ".function: unsupported field '", it.key(), "'"));
      }
    }
    SKIPPY_ASSIGN_OR_RETURN(auto fname, GetString(*f, "name"));
    if (!fname || fname->empty()) return TypeError(StrCat(field, ".function.name"), "a non-empty string");
    const json* args = Get(*f, "arguments");
    runtime::ToolCall call{id.value_or(""), *fname, "{}"};
    if (args) {
      // OpenAI sends the arguments as JSON text; some clients send the object itself.
      if (args->is_string()) {
        call.arguments = args->get<std::string>();
        // A template may parse the arguments into JSON and walk them recursively (llama.cpp does for
        // templates that take them as objects): they get the body's nesting bound.
        if (Status shape = CheckJsonShape(call.arguments, limits); !shape.ok()) {
          return InvalidRequest("json_too_deep", StrCat(field, ".function.arguments: ", shape.message()));
        }
      } else if (args->is_object()) {
        call.arguments = args->dump();
      } else {
        return TypeError(StrCat(field, ".function.arguments"), "a JSON string or an object");
      }
    }
    cm.tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

// OpenAI's tools ([{type: "function", function: {name, description, parameters, strict}}]),
// tool_choice ("none", "auto", "required") and parallel_tool_calls. Chat only.
Status ParseTools(const json& body, GenerationRequest& r) {
  if (const json* t = Get(body, "tools")) {
    if (!t->is_array()) return TypeError("tools", "an array");
    constexpr size_t kMaxTools = 128;
    constexpr size_t kMaxToolSchemaBytes = 64 * 1024;
    if (t->size() > kMaxTools) return absl::InvalidArgumentError(StrCat("more than ", kMaxTools, " tools"));
    size_t schema_bytes = 0;
    for (size_t k = 0; k < t->size(); ++k) {
      const json& tool = (*t)[k];
      const std::string field = StrCat("tools[", k, "]");
      if (!tool.is_object()) return TypeError(field, "an object");
      for (auto it = tool.begin(); it != tool.end(); ++it) {
        if (it.key() != "type" && it.key() != "function" && !it->is_null()) {
          return absl::InvalidArgumentError(StrCat(field, ": unsupported field '", it.key(), "'"));
        }
      }
      SKIPPY_ASSIGN_OR_RETURN(auto type, GetString(tool, "type"));
      if (!type || *type != "function") {
        return InvalidRequest("unsupported_field", StrCat(field, ".type: only \"function\" tools are supported"));
      }
      const json* f = Get(tool, "function");
      if (!f || !f->is_object()) return TypeError(StrCat(field, ".function"), "an object");
      for (auto it = f->begin(); it != f->end(); ++it) {
        if (it.key() != "name" && it.key() != "description" && it.key() != "parameters" && it.key() != "strict" &&
            !it->is_null()) {
          return absl::InvalidArgumentError(StrCat(field, ".function: unsupported field '", it.key(), "'"));
        }
      }
      SKIPPY_ASSIGN_OR_RETURN(auto name, GetString(*f, "name"));
      if (!name || !ValidToolName(*name)) {
        return TypeError(StrCat(field, ".function.name"), "1-64 letters, digits, underscores or dashes");
      }
      for (const runtime::ChatTool& other : r.tools.tools) {
        if (other.name == *name) return absl::InvalidArgumentError(StrCat(field, ": a second tool named '", *name, "'"));
      }
      SKIPPY_ASSIGN_OR_RETURN(auto description, GetString(*f, "description"));
      SKIPPY_ASSIGN_OR_RETURN(auto strict, GetBool(*f, "strict"));
      (void)strict;  // the grammar holds the arguments to the schema either way
      const json* params = Get(*f, "parameters");
      if (params && !params->is_object()) return TypeError(StrCat(field, ".function.parameters"), "a JSON schema object");
      std::string schema = params ? params->dump() : "{}";
      // llama.cpp's schema converter writes the calls' grammar from it, as from a json_schema.
      if (Status s = runtime::CheckJsonSchemaBounds(schema); !s.ok()) {
        return InvalidRequest("invalid_grammar", StrCat(field, ".function.parameters: ", s.message()));
      }
      schema_bytes += schema.size();
      if (schema_bytes > kMaxToolSchemaBytes) {
        return InvalidRequest("invalid_grammar", StrCat("the tools' parameters have more than ", kMaxToolSchemaBytes,
                                                        " bytes of JSON schema in all"));
      }
      r.tools.tools.push_back({*name, description.value_or(""), std::move(schema)});
    }
  }
  if (const json* tc = Get(body, "tool_choice")) {
    if (tc->is_object()) {
      return InvalidRequest("unsupported_field",
                            "unsupported: 'tool_choice' naming a function; give \"none\", \"auto\" or \"required\"");
    }
    if (!tc->is_string() || (*tc != "none" && *tc != "auto" && *tc != "required")) {
      return TypeError("tool_choice", "\"none\", \"auto\" or \"required\"");
    }
    r.tools.choice = *tc == "none"       ? runtime::ToolChoice::kNone
                     : *tc == "required" ? runtime::ToolChoice::kRequired
                                         : runtime::ToolChoice::kAuto;
    if (r.tools.choice == runtime::ToolChoice::kRequired && r.tools.tools.empty()) {
      return absl::InvalidArgumentError("'tool_choice' \"required\" needs tools");
    }
  }
  SKIPPY_ASSIGN_OR_RETURN(r.tools.parallel_calls, GetBool(body, "parallel_tool_calls"));
  return absl::OkStatus();
}

Status ParseMessages(const json& m, GenerationRequest& r, const RequestLimits& limits) {
  if (!m.is_array()) return TypeError("messages", "an array");
  if (m.empty()) return absl::InvalidArgumentError("field 'messages' is empty");
  // Refused before anything is rendered: finding message ends renders and tokenizes every prefix.
  if (m.size() > limits.max_messages) {
    return InvalidRequest("too_many_messages", StrCat("the chat has ", m.size(), " messages; the limit is ",
                                                      limits.max_messages, " (--max-messages)"));
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const json& msg = m[i];
    if (!msg.is_object()) return TypeError(StrCat("messages[", i, "]"), "an object");
    runtime::ChatMessage cm;
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string() || role->get<std::string>().empty()) {
      return TypeError(StrCat("messages[", i, "].role"), "a non-empty string");
    }
    cm.role = role->get<std::string>();
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      cm.content = "";
    } else if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      // OpenAI content parts: only text parts are supported.
      for (const json& part : *content) {
        const auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() || *type != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return absl::InvalidArgumentError(StrCat("messages[", i, "].content: only text parts are supported"));
        }
        // Joined as llama.cpp's chat code joins a message's text parts for a template that takes a
        // string (a newline before each part after a non-empty text); a Jinja template gets the parts.
        if (!cm.content.empty()) cm.content += '\n';
        cm.content += part["text"].get<std::string>();
        cm.text_parts.push_back(part["text"].get<std::string>());
      }
    } else {
      return TypeError(StrCat("messages[", i, "].content"), "a string or an array of text parts");
    }
    for (auto it = msg.begin(); it != msg.end(); ++it) {
      // An assistant message a client sends back as it got it carries these, null or empty.
      const bool empty = it->is_null() || (it.key() == "annotations" && it->is_array() && it->empty());
      if (it.key() != "role" && it.key() != "content" && it.key() != "name" && it.key() != "tool_calls" &&
          it.key() != "tool_call_id" && it.key() != "reasoning_content" && !empty) {
        return absl::InvalidArgumentError(StrCat("messages[", i, "]: unsupported field '", it.key(), "'"));
      }
    }
    SKIPPY_RETURN_IF_ERROR(ParseToolFields(msg, i, limits, cm));
    r.messages.push_back(std::move(cm));
  }
  return absl::OkStatus();
}

// Unknown fields are a 400: a typo must not silently run with defaults.
Status CheckFields(Endpoint endpoint, const json& body) {
  static const std::set<std::string, std::less<>> kCommon = {
      "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
      "cache_salt", "user", "n", "ignore_eos", "presence_penalty", "frequency_penalty", "logprobs", "cache_prompt",
      "return_tokens", "logit_bias", "repeat_penalty", "repeat_last_n", "grammar", "json_schema"};
  static const std::set<std::string, std::less<>> kCompletion = {"prompt", "echo", "suffix", "best_of"};
  static const std::set<std::string, std::less<>> kChat = {
      "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
      "response_format"};
  static const std::set<std::string, std::less<>> kLlama = {"prompt", "n_predict", "id_slot", "t_max_predict_ms",
                                                             "n_probs"};
  const auto& extra = endpoint == Endpoint::kChatCompletions ? kChat
                      : endpoint == Endpoint::kCompletions   ? kCompletion
                                                             : kLlama;
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!it->is_null() && !kCommon.contains(it.key()) && !extra.contains(it.key())) {  // null: absent
      return InvalidRequest("unknown_field", StrCat("unknown field '", it.key(), "'"));
    }
  }

  return absl::OkStatus();
}

Status ParseLength(Endpoint endpoint, const json& body, GenerationRequest& r) {
  const char* len_key = endpoint == Endpoint::kLlamaCompletion ? "n_predict" : "max_tokens";
  SKIPPY_ASSIGN_OR_RETURN(auto max_tokens, GetInt(body, len_key));
  if (endpoint == Endpoint::kLlamaCompletion && !max_tokens) {
    SKIPPY_ASSIGN_OR_RETURN(max_tokens, GetInt(body, "max_tokens"));
    len_key = "max_tokens";
  }
  if (endpoint == Endpoint::kChatCompletions) {
    SKIPPY_ASSIGN_OR_RETURN(auto mct, GetInt(body, "max_completion_tokens"));
    if (mct) {
      max_tokens = mct;
      len_key = "max_completion_tokens";
    }
  }
  if (max_tokens) {
    if (*max_tokens == -1 && endpoint == Endpoint::kLlamaCompletion) {
      r.max_tokens = -1;
    } else if (*max_tokens < 0) {
      return absl::InvalidArgumentError(StrCat("field '", len_key, "' must be >= 0, got ", *max_tokens));
    } else {
      r.max_tokens = *max_tokens;
    }
  }

  return absl::OkStatus();
}

Status ParseSampling(Endpoint endpoint, const json& body, GenerationRequest& r) {
  r.sampling.temperature = endpoint == Endpoint::kLlamaCompletion ? 0.8f : 1.0f;
  SKIPPY_ASSIGN_OR_RETURN(auto temp, GetNumber(body, "temperature"));
  if (temp) {
    if (*temp != 0 && (*temp < kMinTemperature || *temp > 100)) {
      return absl::InvalidArgumentError(
          StrCat("field 'temperature' must be 0 (greedy) or lie in [", kMinTemperature, ", 100]"));
    }
    r.sampling.temperature = static_cast<float>(*temp);
  }
  SKIPPY_ASSIGN_OR_RETURN(auto top_p, GetNumber(body, "top_p"));
  if (top_p) {
    // 0 keeps the most likely token only, as in llama.cpp's sampler and OpenAI's range.
    if (*top_p < 0 || *top_p > 1) return absl::InvalidArgumentError("field 'top_p' must lie in [0, 1]");
    r.sampling.top_p = static_cast<float>(*top_p);
  }
  SKIPPY_ASSIGN_OR_RETURN(auto min_p, GetNumber(body, "min_p"));
  if (min_p) {
    if (*min_p < 0 || *min_p > 1) return absl::InvalidArgumentError("field 'min_p' must lie in [0, 1]");
    r.sampling.min_p = static_cast<float>(*min_p);
  }
  SKIPPY_ASSIGN_OR_RETURN(auto top_k, GetInt(body, "top_k"));
  if (top_k) {
    if (*top_k < 0 || *top_k > INT32_MAX) return absl::InvalidArgumentError("field 'top_k' must be >= 0");
    r.sampling.top_k = static_cast<int32_t>(*top_k);
  }
  // Repetition penalties: OpenAI's presence and frequency penalties, llama-server's repeat_penalty
  // over repeat_last_n tokens (0: none; -1 is a 400, as in the pinned llama-server). Ranges:
  // Sampler::Validate.
  for (auto [key, value] : {std::pair{"presence_penalty", &r.sampling.presence_penalty},
                            std::pair{"frequency_penalty", &r.sampling.frequency_penalty},
                            std::pair{"repeat_penalty", &r.sampling.repeat_penalty}}) {
    SKIPPY_ASSIGN_OR_RETURN(auto v, GetNumber(body, key));
    if (v) {
      if (std::abs(*v) > 1e6) return absl::InvalidArgumentError(StrCat("field '", key, "' is out of range"));
      *value = static_cast<float>(*v);
    }
  }
  SKIPPY_ASSIGN_OR_RETURN(auto last_n, GetInt(body, "repeat_last_n"));
  if (last_n) {
    if (*last_n < 0 || *last_n > (1 << 20)) {
      return absl::InvalidArgumentError("field 'repeat_last_n' must lie in [0, 1048576]");
    }
    r.sampling.penalty_last_n = static_cast<int32_t>(*last_n);
  }
  SKIPPY_ASSIGN_OR_RETURN(auto seed, GetInt(body, "seed"));
  // -1 and 2^32 - 1 (llama.cpp's LLAMA_DEFAULT_SEED) both ask for a random seed, as in llama-server.
  if (seed && *seed != -1 && *seed != UINT32_MAX) {
    if (*seed < 0 || *seed > UINT32_MAX) return absl::InvalidArgumentError("field 'seed' must lie in [0, 2^32)");
    r.sampling.seed = static_cast<uint32_t>(*seed);
    r.seed_given = true;
  }

  return absl::OkStatus();
}

Status ParseStop(const json& body, GenerationRequest& r) {
  if (const json* stop = Get(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 16) return absl::InvalidArgumentError("field 'stop' has more than 16 entries");
      for (const json& s : *stop) {
        if (!s.is_string()) return TypeError("stop", "a string or an array of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return TypeError("stop", "a string or an array of strings");
    }
    for (const auto& s : r.stop) {
      if (s.empty()) return absl::InvalidArgumentError("field 'stop' has an empty string");
    }
  }

  return absl::OkStatus();
}

Status ParseFlags(const json& body, GenerationRequest& r) {
  SKIPPY_ASSIGN_OR_RETURN(auto stream, GetBool(body, "stream"));
  r.stream = stream.value_or(false);
  if (const json* so = Get(body, "stream_options")) {
    if (!so->is_object()) return TypeError("stream_options", "an object");
    auto iu = so->find("include_usage");
    if (iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return TypeError("stream_options.include_usage", "a boolean");
      r.include_usage = iu->get<bool>();
    }
  }
  SKIPPY_ASSIGN_OR_RETURN(auto ignore_eos, GetBool(body, "ignore_eos"));
  r.ignore_eos = ignore_eos.value_or(false);
  SKIPPY_ASSIGN_OR_RETURN(auto return_tokens, GetBool(body, "return_tokens"));
  r.return_tokens = return_tokens.value_or(false);
  SKIPPY_ASSIGN_OR_RETURN(auto n_probs, GetInt(body, "n_probs"));
  if (n_probs) {
    if (*n_probs < 0 || *n_probs > GenerationRequest::kMaxProbs) {
      return absl::InvalidArgumentError(
          StrCat("field 'n_probs' must be in [0, ", GenerationRequest::kMaxProbs, "], got ", *n_probs));
    }
    r.n_probs = static_cast<int32_t>(*n_probs);
  }
  SKIPPY_ASSIGN_OR_RETURN(auto cache_prompt, GetBool(body, "cache_prompt"));
  (void)cache_prompt;  // accepted for llama-server compatibility; the cache is always on unless --no-cache
  SKIPPY_ASSIGN_OR_RETURN(auto salt, GetString(body, "cache_salt"));
  r.cache_salt = salt.value_or("");
  SKIPPY_ASSIGN_OR_RETURN(auto user, GetString(body, "user"));
  (void)user;

  return absl::OkStatus();
}

// A constraint on the generated text, as a GBNF grammar in r.sampling.grammar: llama-server's
// `grammar` (GBNF) or `json_schema`, or on chat OpenAI's `response_format` (json_object, with an
// optional "schema" as llama-server reads it; json_schema, its json_schema.schema). One of them at
// most; a schema is converted here, so one the converter refuses is a 400 before anything runs.
Status ParseOutputFormat(Endpoint endpoint, const json& body, GenerationRequest& r) {
  SKIPPY_ASSIGN_OR_RETURN(auto grammar, GetString(body, "grammar"));
  const json* schema = Get(body, "json_schema");
  if (schema && !schema->is_object()) return TypeError("json_schema", "an object (a JSON schema)");
  const char* schema_field = "json_schema";
  const json any_object = json::object();
  if (const json* rf = endpoint == Endpoint::kChatCompletions ? Get(body, "response_format") : nullptr) {
    const json* type = rf->is_object() ? Get(*rf, "type") : nullptr;
    if (!type || !type->is_string()) return TypeError("response_format", "an object with a string 'type'");
    const json* wanted = nullptr;
    if (*type == "json_object") {
      // Without a schema of its own: any object, or the top-level json_schema (as llama-server).
      wanted = Get(*rf, "schema");
      if (!wanted && !schema) wanted = &any_object;
      if (wanted) schema_field = "response_format.schema";
    } else if (*type == "json_schema") {
      const json* js = Get(*rf, "json_schema");
      if (js && !js->is_object()) return TypeError("response_format.json_schema", "an object");
      wanted = js ? Get(*js, "schema") : nullptr;
      if (!wanted) wanted = &any_object;
      schema_field = "response_format.json_schema.schema";
    } else if (*type != "text") {
      return absl::InvalidArgumentError("field 'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
    }
    if (wanted) {
      if (!wanted->is_object()) return TypeError(schema_field, "an object (a JSON schema)");
      if (schema) return absl::InvalidArgumentError("give a JSON schema in 'json_schema' or in 'response_format', not both");
      schema = wanted;
    }
  }
  if (grammar && !grammar->empty() && schema) {
    return absl::InvalidArgumentError("give either a grammar or a JSON schema, not both");
  }
  if (schema) {
    auto converted = runtime::GrammarFromJsonSchema(schema->dump());
    if (!converted.ok()) {
      return InvalidRequest("invalid_grammar", StrCat("field '", schema_field, "': ", converted.status().message()));
    }
    r.sampling.grammar = *std::move(converted);
    r.grammar_field = schema_field;
  } else if (grammar) {
    r.sampling.grammar = *std::move(grammar);
    r.grammar_field = "grammar";
  }
  return absl::OkStatus();
}

// logit_bias as OpenAI sends it ({"token id": bias}) or as llama-server also takes it ([[token id,
// bias], ...]); a bias of false bans the token (llama-server's). Keys and entries that are text
// rather than token ids are refused (llama-server tokenizes them). Ids are checked against the
// vocabulary with the sampling values.
Status ParseLogitBias(const json& body, GenerationRequest& r) {
  const json* lb = Get(body, "logit_bias");
  if (!lb) return absl::OkStatus();
  auto bias_of = [](const json& v, const std::string& where) -> StatusOr<float> {
    if (v.is_boolean() && !v.get<bool>()) return -std::numeric_limits<float>::infinity();
    if (!v.is_number()) return TypeError(where, "a number in [-100, 100], or false");
    return static_cast<float>(v.get<double>());
  };
  auto token_of = [](const json& v, const std::string& where) -> StatusOr<runtime::Token> {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return TypeError(where, "a token id");
    }
    return static_cast<runtime::Token>(v.get<int64_t>());
  };
  if (lb->is_object()) {
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string where = StrCat("logit_bias[\"", it.key(), "\"]");
      const json id = json::parse(it.key(), nullptr, /*allow_exceptions=*/false);
      SKIPPY_ASSIGN_OR_RETURN(runtime::Token token, token_of(id, StrCat("a key of logit_bias ('", it.key(), "')")));
      SKIPPY_ASSIGN_OR_RETURN(float bias, bias_of(it.value(), where));
      r.sampling.logit_bias.emplace_back(token, bias);
    }
  } else if (lb->is_array()) {
    for (size_t i = 0; i < lb->size(); ++i) {
      const json& e = (*lb)[i];
      const std::string where = StrCat("logit_bias[", i, "]");
      if (!e.is_array() || e.size() != 2) return TypeError(where, "a [token id, bias] pair");
      SKIPPY_ASSIGN_OR_RETURN(runtime::Token token, token_of(e[0], StrCat(where, "[0]")));
      SKIPPY_ASSIGN_OR_RETURN(float bias, bias_of(e[1], StrCat(where, "[1]")));
      r.sampling.logit_bias.emplace_back(token, bias);
    }
  } else {
    return TypeError("logit_bias", "an object of token id to bias, or an array of [token id, bias] pairs");
  }
  return absl::OkStatus();
}

// Fields OpenAI clients send that skippy does not implement: accepted with their neutral values only.
Status ParseNeutralFields(Endpoint endpoint, const json& body, GenerationRequest& r) {
  SKIPPY_ASSIGN_OR_RETURN(auto n, GetInt(body, "n"));
  if (n && *n != 1) return InvalidRequest("unsupported_field", "unsupported: 'n' must be 1");
  SKIPPY_ASSIGN_OR_RETURN(auto best_of, GetInt(body, "best_of"));
  if (best_of && *best_of != 1) return InvalidRequest("unsupported_field", "unsupported: 'best_of' must be 1");
  if (endpoint == Endpoint::kChatCompletions) {
    // OpenAI chat logprobs: the chosen token's and the top_logprobs most likely tokens' (0..kMaxProbs).
    // logprobs false or 0 and top_logprobs 0 are the neutral values OpenAI clients send.
    const json* lpv = Get(body, "logprobs");
    if (lpv && lpv->is_number_integer() && lpv->get<int64_t>() == 0) lpv = nullptr;
    std::optional<bool> lp;
    if (lpv) {
      if (!lpv->is_boolean()) return TypeError("logprobs", "a boolean");
      lp = lpv->get<bool>();
    }
    SKIPPY_ASSIGN_OR_RETURN(auto top, GetInt(body, "top_logprobs"));
    if (top && (*top < 0 || *top > GenerationRequest::kMaxProbs)) {
      return absl::InvalidArgumentError(
          StrCat("field 'top_logprobs' must be in [0, ", GenerationRequest::kMaxProbs, "], got ", *top));
    }
    if (top && *top > 0 && !lp.value_or(false)) {
      return absl::InvalidArgumentError("'top_logprobs' needs 'logprobs': true");
    }
    if (lp.value_or(false)) {
      r.chat_logprobs = true;
      r.top_logprobs = static_cast<int32_t>(top.value_or(0));
      r.n_probs = std::max<int32_t>(1, r.top_logprobs);
    }
  } else if (const json* lp = Get(body, "logprobs"); lp && !(lp->is_boolean() && !lp->get<bool>()) &&
                                                     !(lp->is_number_integer() && lp->get<int64_t>() == 0)) {
    return InvalidRequest("unsupported_field", "unsupported: 'logprobs'");
  }
  SKIPPY_ASSIGN_OR_RETURN(auto echo, GetBool(body, "echo"));
  if (echo.value_or(false)) return InvalidRequest("unsupported_field", "unsupported: 'echo'");
  SKIPPY_ASSIGN_OR_RETURN(auto suffix, GetString(body, "suffix"));
  if (suffix && !suffix->empty()) return InvalidRequest("unsupported_field", "unsupported: 'suffix'");
  SKIPPY_ASSIGN_OR_RETURN(auto id_slot, GetInt(body, "id_slot"));
  (void)id_slot;
  SKIPPY_ASSIGN_OR_RETURN(auto t_max, GetInt(body, "t_max_predict_ms"));
  (void)t_max;
  return absl::OkStatus();
}

}  // namespace

StatusOr<GenerationRequest> ParseGenerationRequest(Endpoint endpoint, const json& body, const RequestLimits& limits) {
  if (!body.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  SKIPPY_RETURN_IF_ERROR(CheckFields(endpoint, body));
  GenerationRequest r;
  r.endpoint = endpoint;
  SKIPPY_ASSIGN_OR_RETURN(auto model, GetString(body, "model"));
  r.model = model.value_or("");
  if (endpoint == Endpoint::kChatCompletions) {
    const json* m = Get(body, "messages");
    if (!m) return absl::InvalidArgumentError("field 'messages' is required");
    SKIPPY_RETURN_IF_ERROR(ParseMessages(*m, r, limits));
  } else {
    const json* p = Get(body, "prompt");
    if (!p) return absl::InvalidArgumentError("field 'prompt' is required");
    SKIPPY_RETURN_IF_ERROR(ParsePrompt(*p, r));
  }
  SKIPPY_RETURN_IF_ERROR(ParseLength(endpoint, body, r));
  SKIPPY_RETURN_IF_ERROR(ParseSampling(endpoint, body, r));
  SKIPPY_RETURN_IF_ERROR(ParseFlags(body, r));
  SKIPPY_RETURN_IF_ERROR(ParseStop(body, r));
  SKIPPY_RETURN_IF_ERROR(ParseNeutralFields(endpoint, body, r));
  SKIPPY_RETURN_IF_ERROR(ParseOutputFormat(endpoint, body, r));
  if (endpoint == Endpoint::kChatCompletions) {
    SKIPPY_RETURN_IF_ERROR(ParseTools(body, r));
    if (r.tools.active() && !r.sampling.grammar.empty()) {
      // The calls' grammar is the constraint (llama-server refuses both too).
      return InvalidRequest("invalid_grammar", StrCat("give either tools or '", r.grammar_field, "', not both"));
    }
  }
  SKIPPY_RETURN_IF_ERROR(ParseLogitBias(body, r));
  // The sampler's own checks, on the float values it will get (top_p 1e-320 is 0 as a float):
  // every request the engine would refuse is a 400 here, streamed or not.
  if (Status s = runtime::Sampler::Validate(r.sampling); !s.ok()) {
    return absl::InvalidArgumentError(StrCat("sampling: ", s.message()));
  }
  return r;
}

StatusOr<std::string> ApplyTemplate(const runtime::Model& model, const json& body, const RequestLimits& limits) {
  if (!body.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "messages" && !it->is_null()) {  // null: absent
      return InvalidRequest("unknown_field", StrCat("unknown field '", it.key(), "'"));
    }
  }
  const json* m = Get(body, "messages");
  if (!m) return absl::InvalidArgumentError("field 'messages' is required");
  GenerationRequest r;
  SKIPPY_RETURN_IF_ERROR(ParseMessages(*m, r, limits));
  SKIPPY_ASSIGN_OR_RETURN(runtime::RenderedChat chat, runtime::RenderChat(model, r.messages, true, /*ends=*/0));
  return chat.text;
}

StatusOr<PreparedPrompt> PreparePrompt(const runtime::Model& model, const GenerationRequest& request,
                                       size_t max_prompt_tokens) {
  auto fits = [&](std::string_view text) -> Status {
    const std::optional<size_t> per_token = model.MaxBytesPerToken();
    if (max_prompt_tokens == 0 || !per_token || text.size() <= max_prompt_tokens * *per_token) return absl::OkStatus();
    return InvalidRequest("context_length_exceeded",
                          StrCat("the prompt's ", text.size(), " bytes make more than ", max_prompt_tokens,
                                 " tokens, the limit (a token of this model stands for at most ", *per_token, " bytes)"));
  };
  PreparedPrompt out;
  if (request.prompt_tokens) {
    out.tokens = *request.prompt_tokens;
  } else if (request.prompt_text) {
    if (request.prompt_text->empty()) return absl::InvalidArgumentError("the prompt is empty");
    SKIPPY_RETURN_IF_ERROR(fits(*request.prompt_text));
    SKIPPY_ASSIGN_OR_RETURN(out.tokens, model.Tokenize(*request.prompt_text, /*add_special=*/true, /*parse_special=*/true));
  } else {
    // Record planning uses the last boundary before the final turn: two ends are looked for (one
    // spare), so rendering and tokenizing stay linear in the number of messages.
    SKIPPY_ASSIGN_OR_RETURN(runtime::RenderedChat chat,
                            runtime::RenderChat(model, request.messages, true, 2, &request.tools));
    SKIPPY_RETURN_IF_ERROR(fits(chat.text));
    if (chat.tool_calling) {
      out.tool_calling = std::move(chat.tool_calling);
      auto parser = runtime::ReplyParser::Create(*out.tool_calling);
      if (!parser.ok()) return InvalidRequest("invalid_request", StrCat("tools: ", parser.status().message()));
      out.reply_parser = *std::move(parser);
    }
    SKIPPY_ASSIGN_OR_RETURN(out.tokens, model.Tokenize(chat.text, true, true));
    // A message boundary counts only where tokenizing the prefix text gives a prefix of the tokens.
    for (size_t end : chat.message_ends) {
      auto part = model.Tokenize(std::string_view(chat.text).substr(0, end), true, true);
      if (!part.ok() || part->empty() || part->size() >= out.tokens.size()) continue;
      if (std::equal(part->begin(), part->end(), out.tokens.begin())) out.message_boundaries.push_back(part->size());
    }
  }
  if (out.tokens.empty()) return absl::InvalidArgumentError("the prompt is empty after tokenization");
  SKIPPY_RETURN_IF_ERROR(model.ValidateTokens(out.tokens));
  if (Status s = runtime::Sampler::Validate(request.sampling, model.n_vocab()); !s.ok()) {
    return InvalidRequest("invalid_request", StrCat("sampling: ", s.message()));  // a logit bias past the vocabulary
  }
  if (Status s = runtime::Sampler::ValidateGrammar(model, request.sampling.grammar); !s.ok()) {
    return InvalidRequest("invalid_grammar", StrCat("field '", request.grammar_field, "': ", s.message()));
  }
  if (out.tool_calling) {
    // The sampling ApplyToolCalling will give the request (a copy of it, not of the whole request).
    runtime::SamplingParams with_tools = request.sampling;
    runtime::ConstrainToCalls(*out.tool_calling, with_tools);
    if (Status s = runtime::Sampler::ValidateGrammar(model, with_tools); !s.ok()) {
      return InvalidRequest("invalid_grammar", StrCat("field 'tools': ", s.message()));
    }
  }
  return out;
}

void ApplyToolCalling(const runtime::ToolCalling& calling, GenerationRequest& r) {
  // ParseGenerationRequest refused a grammar of the request's own beside tools that may be called;
  // with tool_choice none the calls have no grammar and the request's stands.
  runtime::ConstrainToCalls(calling, r.sampling);
  if (!calling.grammar.empty()) r.grammar_field = "tools";
  for (const std::string& stop : calling.stops) {
    if (!stop.empty() && std::find(r.stop.begin(), r.stop.end(), stop) == r.stop.end()) r.stop.push_back(stop);
  }
}

Status CheckJsonShape(std::string_view body, const RequestLimits& limits) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits.max_json_depth) {
        return InvalidRequest("json_too_deep", StrCat("the JSON body nests deeper than ", limits.max_json_depth,
                                                      " levels"));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return absl::OkStatus();
}

StatusOr<int64_t> CheckBudget(const Budget& b, size_t prompt_tokens, int64_t max_tokens) {
  const int64_t ctx = b.context;
  const auto n = static_cast<int64_t>(prompt_tokens);
  const int64_t max_prompt = b.prompt_limit();
  if (n > max_prompt) {
    return InvalidRequest("context_length_exceeded", StrCat("the prompt has ", n, " tokens; the limit is ", max_prompt,
                                                            " (context ", ctx, " per request)"));
  }
  const int64_t limit = b.max_tokens_limit > 0 ? std::min(b.max_tokens_limit, ctx) : ctx;
  if (max_tokens < 0) {
    // No length asked: until the end of the sequence or of the context (llama-server's -n -1),
    // within --max-tokens-limit and -n.
    int64_t most = std::min(limit, ctx - n);
    if (b.default_max_tokens >= 0) most = std::min(most, b.default_max_tokens);
    return std::max<int64_t>(0, most);
  }
  if (max_tokens > limit) {
    return InvalidRequest("invalid_max_tokens", StrCat("max_tokens ", max_tokens, " exceeds the limit of ", limit));
  }
  if (n + max_tokens > ctx) {
    return InvalidRequest("context_length_exceeded", StrCat("prompt (", n, " tokens) + max_tokens (", max_tokens,
                                                            ") exceeds the context of ", ctx, " tokens per request"));
  }
  return max_tokens;
}

}  // namespace skippy::server
