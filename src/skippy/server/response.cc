#include "skippy/server/response.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <string_view>

#include "httplib.h"
#include "skippy/common/strings.h"

namespace skippy::server {

using nlohmann::json;

namespace {

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence.
size_t Utf8SafeLength(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

// llama-server's /completion "completion_probabilities" shape (n_probs).
json LogprobsJson(const std::vector<TokenLogprobs>& all) {
  json out = json::array();
  for (const TokenLogprobs& t : all) {
    json top = json::array();
    for (const auto& c : t.top) top.push_back({{"id", c.id}, {"token", c.piece}, {"logprob", c.logprob}});
    out.push_back(
        {{"id", t.chosen.id}, {"token", t.chosen.piece}, {"logprob", t.chosen.logprob}, {"top_logprobs", top}});
  }
  return out;
}

// OpenAI's chat "logprobs": {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json ChatLogprobsJson(const std::vector<TokenLogprobs>& all, int32_t top_n) {
  auto entry = [](const TokenLogprobs::Candidate& c) {
    std::vector<int> bytes;  // 0-255 (char is signed here)
    for (unsigned char ch : c.piece) bytes.push_back(ch);
    return json{{"token", c.piece}, {"logprob", c.logprob}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const TokenLogprobs& t : all) {
    json e = entry(t.chosen);
    e["top_logprobs"] = json::array();
    for (size_t i = 0; i < t.top.size() && i < static_cast<size_t>(top_n); ++i) e["top_logprobs"].push_back(entry(t.top[i]));
    content.push_back(std::move(e));
  }
  return {{"content", content}};
}

json TimingsJson(const JobTimings& t) {
  return {{"cache_n", t.cache_n},
          {"prompt_n", t.prompt_n},
          {"prompt_ms", t.prompt_ms},
          {"prompt_per_second", t.prompt_ms > 0 ? 1000.0 * t.prompt_n / t.prompt_ms : 0.0},
          {"predicted_n", t.predicted_n},
          {"predicted_ms", t.predicted_ms},
          {"predicted_per_second", t.predicted_ms > 0 ? 1000.0 * t.predicted_n / t.predicted_ms : 0.0}};
}

json SkippyJson(const JobTimings& t) {
  return {{"cache_hit", t.cache_miss_reason.empty()},
          {"cache_payload", t.cache_payload},
          {"cache_tier", t.cache_tier},
          {"cache_miss_reason", t.cache_miss_reason},
          {"decoded_result_hit", t.decoded_result_hit},
          {"queue_ms", t.queue_ms},
          {"prefix_wait_ms", t.prefix_wait_ms},
          {"ttft_ms", t.ttft_ms},
          {"restore_ms", t.restore_ms},
          {"record_ms", t.record_ms}};
}

json UsageJson(size_t prompt_tokens, const Job::View& v) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", v.tokens.size()},
          {"total_tokens", prompt_tokens + v.tokens.size()},
          {"prompt_tokens_details", {{"cached_tokens", v.timings.cache_n}}}};
}

// An id for a call the model's format gave none: OpenAI's shape, random (clients key results by it).
std::string NewToolCallId() {
  static constexpr char kChars[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof kChars - 1)];
  return id;
}

// Each call keeps the id its index got first (the model's, or a new one).
void AssignToolCallIds(runtime::ParsedReply& reply, std::vector<std::string>& ids) {
  for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
    if (ids.size() <= i) ids.push_back(reply.tool_calls[i].id.empty() ? NewToolCallId() : reply.tool_calls[i].id);
    reply.tool_calls[i].id = ids[i];
  }
}

// A chat answer with tools read back. `partial`: the text so far of an answer still running. An
// answer cut by max_tokens is read as a partial one: a call whose arguments were cut stays a call
// with its arguments cut short (as OpenAI sends them), a call cut before its name was read is
// left out (as a stream leaves it out while it is written). A whole answer that is not in the
// template's format is its text as it is.
StatusOr<runtime::ParsedReply> ReadReply(const runtime::ReplyParser& parser, const std::string& text, bool partial,
                                         const std::string& finish_reason) {
  StatusOr<runtime::ParsedReply> reply = parser.Parse(text, partial || finish_reason == "length");
  if (!partial && !reply.ok()) return runtime::ParsedReply{.content = text};
  return reply;
}

// OpenAI's assistant message: content (null beside calls when there is none), reasoning_content
// (llama-server's) and tool_calls.
json MessageJson(const runtime::ParsedReply& r) {
  json m = {{"role", "assistant"}};
  m["content"] = r.content.empty() && !r.tool_calls.empty() ? json(nullptr) : json(r.content);
  if (!r.reasoning_content.empty()) m["reasoning_content"] = r.reasoning_content;
  if (!r.tool_calls.empty()) {
    json calls = json::array();
    for (const runtime::ToolCall& c : r.tool_calls) {
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

// A stream's delta for one change of the parsed answer (OpenAI's chunk delta; a call's id, type
// and name come with its first delta).
json DeltaJson(const runtime::ReplyDelta& d) {
  json delta = json::object();
  if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
  if (!d.content.empty()) delta["content"] = d.content;
  if (d.tool_call_index) {
    json call = {{"index", *d.tool_call_index}};
    if (!d.tool_call.id.empty()) {
      call["id"] = d.tool_call.id;
      call["type"] = "function";
    }
    json function = json::object();
    if (!d.tool_call.name.empty()) function["name"] = d.tool_call.name;
    if (!d.tool_call.arguments.empty()) function["arguments"] = d.tool_call.arguments;
    if (!function.empty()) call["function"] = std::move(function);
    delta["tool_calls"] = json::array({std::move(call)});
  }
  return delta;
}

bool Event(httplib::DataSink& sink, const json& j) {
  const std::string line = StrCat("data: ", Dump(j), "\n\n");
  return sink.write(line.data(), line.size());
}

}  // namespace

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Completion::Completion(Endpoint endpoint, const GenerationRequest& request, std::string model, size_t prompt_tokens,
                       std::shared_ptr<const runtime::ReplyParser> parser)
    : endpoint_(endpoint),
      created_(NowSeconds()),
      model_(std::move(model)),
      prompt_tokens_(prompt_tokens),
      return_tokens_(request.return_tokens),
      include_usage_(request.include_usage),
      n_probs_(request.n_probs),
      chat_logprobs_(request.chat_logprobs),
      top_logprobs_(request.top_logprobs) {
  // Unique across restarts and replicas (clients and logs key answers by id): a random prefix per
  // process, then a counter.
  static const std::string process = [] {
    std::random_device rd;
    return fmt::format("{:08x}{:08x}", rd(), rd());
  }();
  static std::atomic<uint64_t> next_id{1};
  id_ = StrCat(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", process, "-", next_id++);
  for (const auto& st : request.stop) hold_ = std::max(hold_, st.size() - 1);
  if (endpoint == Endpoint::kChatCompletions) parser_ = std::move(parser);
}

std::string Completion::FinishReason(const Job::View& v, const runtime::ParsedReply* reply) const {
  return reply != nullptr && !reply->tool_calls.empty() && v.finish_reason == "stop" ? "tool_calls" : v.finish_reason;
}

json Completion::Body(const Job::View& v) const {
  json out;
  if (endpoint_ == Endpoint::kLlamaCompletion) {
    out = {{"content", v.text},
           {"model", model_},
           {"stop", true},
           {"stop_type", v.finish_reason == "length" ? "limit" : "eos"},
           {"tokens_predicted", v.tokens.size()},
           {"tokens_evaluated", prompt_tokens_},
           {"tokens_cached", v.timings.cache_n},
           {"truncated", false},
           {"timings", TimingsJson(v.timings)},
           {"skippy", SkippyJson(v.timings)}};
    if (return_tokens_) out["tokens"] = v.tokens;
    if (n_probs_ > 0) out["completion_probabilities"] = LogprobsJson(v.logprobs);
    return out;
  }
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", v.finish_reason}};
  if (endpoint_ == Endpoint::kCompletions) {
    choice["text"] = v.text;
  } else if (parser_ != nullptr) {
    StatusOr<runtime::ParsedReply> reply = ReadReply(*parser_, v.text, /*partial=*/false, v.finish_reason);
    std::vector<std::string> ids;
    AssignToolCallIds(*reply, ids);
    choice["message"] = MessageJson(*reply);
    choice["finish_reason"] = FinishReason(v, &*reply);
    if (chat_logprobs_) choice["logprobs"] = ChatLogprobsJson(v.logprobs, top_logprobs_);
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", v.text}};
    if (chat_logprobs_) choice["logprobs"] = ChatLogprobsJson(v.logprobs, top_logprobs_);
  }
  out = {{"id", id_}, {"object", endpoint_ == Endpoint::kCompletions ? "text_completion" : "chat.completion"},
         {"created", created_}, {"model", model_}, {"choices", json::array({choice})},
         {"usage", UsageJson(prompt_tokens_, v)}, {"timings", TimingsJson(v.timings)},
         {"skippy", SkippyJson(v.timings)}};
  if (return_tokens_) out["tokens"] = v.tokens;
  return out;
}

json Completion::Chunk(const std::string& text, const std::vector<runtime::Token>& toks,
                       const std::optional<std::string>& finish, const std::vector<TokenLogprobs>& probs) const {
  if (endpoint_ == Endpoint::kLlamaCompletion) {
    json j = {{"content", text}, {"stop", false}};
    if (return_tokens_) j["tokens"] = toks;
    if (n_probs_ > 0) j["completion_probabilities"] = LogprobsJson(probs);
    return j;
  }
  const json fr = finish ? json(*finish) : json(nullptr);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", fr}};
  if (endpoint_ == Endpoint::kCompletions) {
    choice["text"] = text;
  } else {
    choice["delta"] = finish ? json::object() : json{{"content", text}};
    // A streamed chat's log-probabilities: each chunk carries its own tokens' entries.
    if (chat_logprobs_ && !probs.empty()) choice["logprobs"] = ChatLogprobsJson(probs, top_logprobs_);
  }
  json j = StreamEvent(json::array({choice}));
  if (return_tokens_) j["tokens"] = toks;
  return j;
}

json Completion::Last(const Job::View& v, const StreamState& state) const {
  if (endpoint_ == Endpoint::kLlamaCompletion) {
    return {{"content", ""}, {"stop", true}, {"model", model_},
            {"stop_type", v.finish_reason == "length" ? "limit" : "eos"},
            {"tokens_predicted", v.tokens.size()}, {"tokens_evaluated", prompt_tokens_},
            {"tokens_cached", v.timings.cache_n}, {"timings", TimingsJson(v.timings)},
            {"skippy", SkippyJson(v.timings)}};
  }
  json last = Chunk("", {}, FinishReason(v, parser_ != nullptr ? &state.reply : nullptr), {});
  last["timings"] = TimingsJson(v.timings);
  last["skippy"] = SkippyJson(v.timings);
  return last;
}

json Completion::UsageChunk(const Job::View& v) const {
  // OpenAI's stream_options.include_usage: one more chunk with empty choices, as llama-server sends.
  json j = StreamEvent(json::array());
  j["usage"] = UsageJson(prompt_tokens_, v);
  return j;
}

json Completion::StreamEvent(json choices) const {
  return {{"id", id_}, {"object", endpoint_ == Endpoint::kCompletions ? "text_completion" : "chat.completion.chunk"},
          {"created", created_}, {"model", model_}, {"choices", std::move(choices)}};
}

bool Completion::SendNew(const Job::View& v, StreamState& state, httplib::DataSink& sink) const {
  // Held back: an incomplete last character, and the bytes a stop string could still begin in,
  // cut where a character begins (a stop string may end inside one).
  const size_t upto_held = v.text.size() - std::min(hold_, v.text.size());
  size_t upto = v.done ? v.text.size() : Utf8SafeLength(std::string_view(v.text).substr(0, upto_held));
  upto = std::max(upto, state.sent_bytes);
  // With a parser the finished answer is parsed whole once more: the last poll may have seen all
  // of its text, parsed as a partial answer.
  const bool parse_whole = parser_ != nullptr && v.done && !state.parsed_whole;
  if (upto > state.sent_bytes || v.tokens.size() > state.sent_tokens || parse_whole) {
    const std::vector<runtime::Token> toks(
        v.tokens.begin() + static_cast<long>(std::min(state.sent_tokens, v.tokens.size())), v.tokens.end());
    const std::string text = v.text.substr(state.sent_bytes, upto - state.sent_bytes);
    std::vector<TokenLogprobs> probs;
    if (n_probs_ > 0 && v.logprobs_from + v.logprobs.size() > state.sent_tokens && v.logprobs_from <= state.sent_tokens) {
      probs.assign(v.logprobs.begin() + static_cast<long>(state.sent_tokens - v.logprobs_from), v.logprobs.end());
    }
    if (parser_ != nullptr) {
      if (!SendReplyDeltas(v, upto, state, std::move(probs), sink)) return false;
    } else if (!text.empty() || ((return_tokens_ || n_probs_ > 0) && !toks.empty())) {
      if (!Event(sink, Chunk(text, toks, std::nullopt, probs))) return false;
    }
    state.sent_bytes = upto;
    state.sent_tokens = v.tokens.size();
  } else if (!v.done) {
    // Nothing new: a comment line keeps the connection honest (and finds a gone client).
    static const char kPing[] = ": ping\n\n";
    if (!sink.is_writable() || !sink.write(kPing, sizeof kPing - 1)) return false;
  }
  return true;
}

bool Completion::SendReplyDeltas(const Job::View& v, size_t upto, StreamState& state, std::vector<TokenLogprobs> probs,
                                 httplib::DataSink& sink) const {
  const bool whole = v.done && upto == v.text.size();
  StatusOr<runtime::ParsedReply> reply = ReadReply(*parser_, v.text.substr(0, upto), !whole, v.finish_reason);
  std::vector<runtime::ReplyDelta> deltas;
  if (reply.ok()) {
    AssignToolCallIds(*reply, state.tool_ids);
    // A parse that takes back what was sent (a partial call read otherwise once more text came)
    // waits for more text.
    if (auto d = runtime::StreamDeltas(state.reply, *reply, /*partial=*/!whole, state.named); d.ok()) {
      deltas = *std::move(d);
      state.reply = *std::move(reply);
    }
  }
  state.parsed_whole = whole;
  if (deltas.empty() && !probs.empty()) deltas.emplace_back();  // the tokens' log-probabilities still go out
  for (size_t i = 0; i < deltas.size(); ++i) {
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}, {"delta", DeltaJson(deltas[i])}};
    if (i == 0 && chat_logprobs_ && !probs.empty()) choice["logprobs"] = ChatLogprobsJson(probs, top_logprobs_);
    json event = StreamEvent(json::array({std::move(choice)}));
    if (!Event(sink, event)) return false;
  }
  return true;
}

bool Completion::Stream(Job& job, StreamState& state, httplib::DataSink& sink) const {
  if (!state.started) {
    state.started = true;
    if (endpoint_ == Endpoint::kChatCompletions) {
      const json first = StreamEvent(json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                   {"logprobs", nullptr}, {"finish_reason", nullptr}}}));
      if (!Event(sink, first)) {
        job.Cancel();
        return false;
      }
    }
  }
  while (true) {
    const Job::View v = job.WaitFor(state.sent_tokens, std::chrono::milliseconds(200));
    if (v.done && v.error) {
      Event(sink, v.error->Body());
      sink.done();
      return true;
    }
    if (!SendNew(v, state, sink)) {
      job.Cancel();
      return false;
    }
    if (v.done) {
      bool ok = Event(sink, Last(v, state));
      if (ok && include_usage_ && endpoint_ != Endpoint::kLlamaCompletion) ok = Event(sink, UsageChunk(v));
      if (ok && endpoint_ != Endpoint::kLlamaCompletion) {
        static const char kDone[] = "data: [DONE]\n\n";
        ok = sink.write(kDone, sizeof kDone - 1);
      }
      sink.done();
      return ok;
    }
  }
}

}  // namespace skippy::server
