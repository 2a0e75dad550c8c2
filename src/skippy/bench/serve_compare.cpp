#include "skippy/bench/serve_compare.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <optional>

#include "skippy/bench/chart.h"
#include "skippy/bench/model_server.h"
#include "skippy/bench/production.h"
#include "skippy/bench/report.h"
#include "skippy/common/stats.h"
#include "skippy/common/strings.h"
#include "skippy/zoo/zoo_spec.h"

namespace skippy::bench {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

StatusOr<ModelServerOptions> ServerOptions(const ServeCompareOptions& o, const std::string& server, const std::string& model,
                                           const fs::path& log) {
  if (server == "skippy") {
    ModelServerOptions so = MatchedServerOptions(o, ServerKind::kSkippyServer, o.skippy_server_bin, model, o.lanes, log.string());
    so.extra_args = o.skippy_args;
    return so;
  }
  ModelServerOptions so = MatchedServerOptions(o, ServerKind::kLlamaServer, o.llama_server_bin, model, o.lanes, log.string());
  if (server == "llama-matched") {
    so.extra_args = {"--cache-ram", "0"};
  } else if (server == "llama-default") {
    so.flash_attn_auto = true;
  } else {
    return absl::InvalidArgumentError(StrCat("unknown server '", server, "' (skippy, llama-default, llama-matched)"));
  }
  return so;
}

}  // namespace

json SummarizeStreamRuns(const std::vector<StreamRun>& runs, double wall_s, double ttft_slo_ms, double tpot_slo_ms) {
  std::vector<double> ttft, e2e, tpot, gap;
  int64_t reused = 0, recomputed = 0, tokens = 0;
  int ok = 0, errors = 0, good = 0, unanswered = 0;
  for (const StreamRun& r : runs) {
    if (!r.ok) {
      ++unanswered;
      continue;
    }
    ++ok;
    if (!r.served()) ++errors;
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.total_ms);
    if (r.tokens > 1) {
      tpot.push_back(r.tpot_ms);
      gap.push_back(r.max_gap_ms);
    }
    tokens += r.tokens;
    if (r.served() && r.ttft_ms <= ttft_slo_ms && (tpot_slo_ms <= 0 || r.tpot_ms <= tpot_slo_ms)) ++good;
    reused += r.timings.value("cache_n", 0);
    recomputed += r.timings.value("prompt_n", 0);
  }
  return {{"requests", runs.size()},           {"ok_requests", ok}, {"errors", errors}, {"unanswered", unanswered},
          {"ttft_p50_ms", Percentile(ttft, 0.5)}, {"ttft_p95_ms", Percentile(ttft, 0.95)},
          {"e2e_p50_ms", Percentile(e2e, 0.5)},   {"e2e_p95_ms", Percentile(e2e, 0.95)},
          {"tpot_p50_ms", Percentile(tpot, 0.5)}, {"tpot_p95_ms", Percentile(tpot, 0.95)},
          {"max_gap_p50_ms", Percentile(gap, 0.5)}, {"max_gap_p95_ms", Percentile(gap, 0.95)},
          {"prompt_tokens_reused", reused},       {"prompt_tokens_recomputed", recomputed},
          {"wall_s", wall_s},                     {"throughput_rps", wall_s > 0 ? (ok - errors) / wall_s : 0.0},
          {"generated_tokens_per_s", wall_s > 0 ? tokens / wall_s : 0.0},
          {"goodput_rps", wall_s > 0 ? good / wall_s : 0.0},
          {"slo_attainment", runs.empty() ? 0.0 : static_cast<double>(good) / static_cast<double>(runs.size())}};
}

namespace {

json Summarize(const std::vector<StreamRun>& runs, double wall_s, const ServeCompareOptions& o) {
  return SummarizeStreamRuns(runs, wall_s, o.ttft_slo_ms, o.tpot_slo_ms);
}

// A TPOT or stall percentile of a summary; "-" for runs from before it was summarized.
std::string MsOrDash(const json& summary, const char* key) {
  return summary.contains(key) ? fmt::format("{:.1f}", summary.value(key, 0.0)) : std::string("-");
}

// "agree/total", and for Skippy's disagreements how many were near-ties (DivergenceOf).
std::string AgreementCell(const json& r) {
  if (!r.contains("agreement")) return "-";
  std::string cell = r["agreement"].get<std::string>();
  if (const json& d = r.value("disagreements", json::array()); d.is_array() && !d.empty()) {
    size_t ties = 0, same = 0;
    for (const json& e : d) {
      const bool same_tokens = e.value("same_tokens", false) || e.value("withheld_tail", false);
      same += same_tokens ? 1 : 0;
      ties += !same_tokens && e.value("near_tie", false) ? 1 : 0;
    }
    cell += " (";
    if (same > 0) cell += StrCat(same, " same tokens as far as llama-server sent them");
    if (same > 0 && ties > 0) cell += ", ";
    if (ties > 0 || same == 0) cell += StrCat(ties, " of ", d.size() - same, " near-ties");
    cell += ")";
  }
  return cell;
}

// Skippy against both llama-server runs, one row per (family, workload) that has all three.
std::string HeadToHead(const json& doc) {
  std::map<std::pair<std::string, std::string>, std::map<std::string, const json*>> rows;
  std::vector<std::pair<std::string, std::string>> order;
  for (const json& r : doc["summary"]) {
    auto key = std::make_pair(r.value("family", ""), r.value("workload", ""));
    if (!rows.count(key)) order.push_back(key);
    rows[key][r.value("server", "")] = &r;
  }
  std::string md =
      "| Family | Workload | Skippy TTFT p50 ms | llama-server (default) | llama-server (--cache-ram 0) | "
      "vs faster llama-server | prompt tokens reused: Skippy / llama default | outputs agree |\n"
      "|---|---|---:|---:|---:|---:|---|---|\n";
  size_t shown = 0;
  for (const auto& key : order) {
    const auto& by = rows[key];
    if (!by.count("skippy") || !by.count("llama-default") || !by.count("llama-matched")) continue;
    const json& sk = *by.at("skippy");
    const json& ld = *by.at("llama-default");
    const json& lm = *by.at("llama-matched");
    const double s = sk.value("ttft_p50_ms", 0.0);
    const double best = std::min(ld.value("ttft_p50_ms", 0.0), lm.value("ttft_p50_ms", 0.0));
    md += StrCat("| ", key.first, " | ", key.second, " | ", fmt::format("{:.1f}", s), " | ",
                 fmt::format("{:.1f}", ld.value("ttft_p50_ms", 0.0)), " | ", fmt::format("{:.1f}", lm.value("ttft_p50_ms", 0.0)),
                 " | ", s > 0 ? fmt::format("{:.2f}x", best / s) : std::string("-"), " | ",
                 sk.value("prompt_tokens_reused", int64_t{0}), " / ", ld.value("prompt_tokens_reused", int64_t{0}), " | ",
                 AgreementCell(sk), " |\n");
    ++shown;
  }
  return shown > 0 ? md : std::string();
}

// The restart workload's phases: TTFT p50 before the restart, after it (the disk tier for Skippy),
// and warm again (RAM), per family and server.
std::string RestartTable(const json& doc) {
  std::string rows;
  for (const json& r : doc["summary"]) {
    if (!r.contains("phases_ttft_p50_ms")) continue;
    const json& p = r["phases_ttft_p50_ms"];
    const double first = p.value("first", 0.0), after = p.value("after-restart", 0.0), warm = p.value("warm", 0.0);
    rows += StrCat("| ", r.value("family", ""), " | ", r.value("server", ""), " | ", fmt::format("{:.1f}", first), " | ",
                   fmt::format("{:.1f}", after), " | ", fmt::format("{:.1f}", warm), " | ",
                   warm > 0 ? fmt::format("{:.2f}x", after / warm) : std::string("-"), " |\n");
  }
  if (rows.empty()) return "";
  return StrCat("\n## Restart (TTFT p50 ms per phase; medians over repeats)\n\n"
                "Each document is asked about once, the server is stopped and started again, each is asked a new "
                "question (\"after restart\": skippy-server reads its disk tier, llama-server starts cold), then a third "
                "(\"warm\": RAM). \"after / warm\": how much slower the first request after the restart is than a warm one.\n\n"
                "| Family | Server | first | after restart | warm | after / warm |\n|---|---|---:|---:|---:|---:|\n",
                rows);
}

// Runs and sweep levels that did not finish "ok": which server, and why. Their numbers are in no
// table above (a failed run is not in the medians).
std::string FailedRuns(const json& doc) {
  std::string rows;
  auto add = [&](const json& r, const std::string& what) {
    if (r.value("status", "ok") == "ok") return;
    rows += StrCat("| ", MarkdownCell(r.value("family", "")), " | ", MarkdownCell(what), " | ",
                   MarkdownCell(r.value("server", "")), " | ", MarkdownCell(r.value("status", "")), " | ",
                   MarkdownCell(r.value("error", "")), " |\n");
  };
  for (const json& r : doc.value("runs", json::array())) {
    add(r, StrCat(r.value("workload", ""), " repeat ", r.value("repeat", 0) + 1));
  }
  for (const json& l : doc.value("concurrency_sweep", json::array())) {
    add(l, StrCat(l.value("concurrency", 0), " clients"));
  }
  if (rows.empty()) return "";
  return StrCat("\n## Failed runs\n\nNot in the medians above (a sweep level's latencies are of its answered "
                "requests).\n\n| Family | Run | Server | Status | Error |\n|---|---|---|---|---|\n",
                rows);
}

std::string Markdown(const json& doc) {
  std::string md = StrCat("# skippy-server vs llama-server\n\n",
                          doc.value("synthetic_weights", true) ? "Synthetic-weight models (skippy-zoo); speed only, not quality.\n\n" : "",
                          "TTFT and end-to-end latency are measured at the client (same C++ client, streamed /completion). "
                          "Medians over repeats of each run's p50. \"vs faster llama-server\" is the faster llama-server "
                          "TTFT p50 divided by Skippy's (above 1x: Skippy is faster). \"outputs agree\": greedy texts equal to "
                          "llama-matched's; where Skippy's differ, both servers replay the workload with token ids and n_probs: "
                          "\"same tokens as far as llama-server sent them\" counts requests where every token id llama-server "
                          "streamed is Skippy's and it then stopped sending (on random weights: text that is not valid UTF-8, "
                          "which llama-server holds back and at the end answers with an error event; skippy-server sends "
                          "U+FFFD), a near-tie one whose first differing tokens were within 0.1 nats of "
                          "each other on both servers (serve-compare.json \"disagreements\").\n\n");
  if (const json& st = doc.value("settings", json::object()); st.contains("flash_attn")) {
    md += StrCat("Settings: ", st.value("lanes", 0), " lane(s) = slot(s), ", st.value("threads", 0), " threads, ctx ",
                 st.value("ctx_size", 0), " per request, batch ", st.value("batch_size", 0), "; flash attention ",
                 st.value("flash_attn", false) ? "on" : "off", " for skippy-server and llama-matched, ",
                 st.value("llama_default_flash_attn", std::string("the same")), " for llama-default",
                 st.value("zoo_format", std::string()).empty() ? std::string()
                                                                : StrCat("; weights ", st.value("zoo_format", std::string())),
                 st.value("think_ms", 0) > 0 ? StrCat("; ", st.value("think_ms", 0), " ms before each reply goes back")
                                             : std::string(),
                 ".\n\n");
  }
  bool replies = false;
  for (const json& r : doc["summary"]) {
    StatusOr<Workload> w = MakeWorkload(r.value("workload", ""), WorkloadOptions{});
    replies = replies || (w.ok() && w->has_replies());
  }
  if (replies) {
    md += "A workload that sends the server's replies back gives each server its own replies, so from the second "
          "turn on the servers' prompts differ (in length, and in how much of a reply tokenizes back): a ratio across "
          "servers there compares different work. Runs of one server with other flags compare the same prompts "
          "(skippy-server's answers do not depend on its cache).\n\n";
  }
  if (std::string h = HeadToHead(doc); !h.empty()) md += h + "\n## All runs\n\n";
  md += StrCat("| Family | Workload | Server | TTFT p50 ms | TTFT p95 ms | e2e p50 ms | reused / recomputed prompt tokens | "
                          "goodput rps | peak RSS MiB | outputs agree with llama-matched |\n"
                          "|---|---|---|---:|---:|---:|---:|---:|---:|---|\n");
  for (const json& r : doc["summary"]) {
    md += StrCat("| ", r.value("family", ""), " | ", r.value("workload", ""), " | ", r.value("server", ""), " | ",
                 fmt::format("{:.1f}", r.value("ttft_p50_ms", 0.0)), " | ", fmt::format("{:.1f}", r.value("ttft_p95_ms", 0.0)),
                 " | ", fmt::format("{:.1f}", r.value("e2e_p50_ms", 0.0)), " | ", r.value("prompt_tokens_reused", int64_t{0}),
                 " / ", r.value("prompt_tokens_recomputed", int64_t{0}), " | ", fmt::format("{:.2f}", r.value("goodput_rps", 0.0)),
                 " | ", fmt::format("{:.0f}", r.value("peak_rss_bytes", uint64_t{0}) / 1048576.0), " | ",
                 AgreementCell(r), " |\n");
  }
  md += RestartTable(doc);
  for (const auto& c : doc.value("charts", json::array())) md += StrCat("\n![", c.get<std::string>(), "](", c.get<std::string>(), ")\n");
  if (!doc["concurrency_sweep"].empty()) {
    const json& first = doc["concurrency_sweep"].front();
    const double tpot_slo = doc["settings"].value("tpot_slo_ms", 0.0);
    md += StrCat("\n## Concurrency sweep (", first.value("workload", "interleaved-prefixes"), "; lanes = slots = clients; TTFT SLO ",
                 doc["settings"].value("ttft_slo_ms", 0.0), " ms",
                 tpot_slo > 0 ? StrCat(", TPOT SLO ", tpot_slo, " ms") : std::string(), ")\n\n"
                 "| Family | Clients | Server | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | TPOT p95 ms | longest stall p95 ms | "
                 "throughput rps | tokens/s | goodput rps | SLO attainment | errors: cut short / no answer |\n"
                 "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const json& l : doc["concurrency_sweep"]) {
      const json& s = l.value("summary", json::object());
      md += StrCat("| ", l.value("family", ""), " | ", l.value("concurrency", 0), " | ", l.value("server", ""), " | ",
                   fmt::format("{:.1f}", s.value("ttft_p50_ms", 0.0)), " | ", fmt::format("{:.1f}", s.value("ttft_p95_ms", 0.0)),
                   " | ", MsOrDash(s, "tpot_p50_ms"), " | ", MsOrDash(s, "tpot_p95_ms"), " | ", MsOrDash(s, "max_gap_p95_ms"),
                   " | ", fmt::format("{:.2f}", s.value("throughput_rps", 0.0)),
                   " | ", fmt::format("{:.1f}", s.value("generated_tokens_per_s", 0.0)),
                   " | ", fmt::format("{:.2f}", s.value("goodput_rps", 0.0)),
                   " | ", fmt::format("{:.0f}%", 100 * s.value("slo_attainment", 0.0)), " | ",
                   s.contains("errors") ? StrCat(s.value("errors", 0), " / ", s.value("unanswered", 0)) : std::string("-"),
                   " |\n");
    }
  }
  md += FailedRuns(doc);
  return md;
}

// Greedy runs whose texts differ: where they part, and by how much each server's logits preferred
// its own token there (see DivergenceOf in serve_compare.h).
json ExplainDisagreements(const ServeCompareOptions& o, const std::string& key, const std::string& model,
                          const Workload& w, const std::string& server, const std::vector<size_t>& differing,
                          const std::map<std::string, std::vector<std::string>>& texts, const fs::path& work) {
  std::map<std::string, std::vector<StreamRun>> replay;
  for (const std::string& name : {server, std::string("llama-matched")}) {
    auto so = ServerOptions(o, name, model, work / StrCat(key, "-", w.name, "-", name, "-probe.log"));
    if (!so.ok()) return {{"error", std::string(so.status().message())}};
    auto srv = ModelServer::Start(*so);
    if (!srv.ok()) return {{"error", std::string(srv.status().message())}};
    // The whole workload again, in order, so each server's cache holds what it held in the timed run.
    // Streamed, as in the timed runs (llama-server refuses some random-weight outputs unstreamed).
    ReplyChain chain;
    for (const WorkloadRequest& req : w.requests) {
      const std::string prompt = chain.PromptFor(req);
      replay[name].push_back(srv->StreamComplete(prompt, req.n_predict, kProbeTopN));
      chain.Answered(req, prompt, replay[name].back().content);
    }
    srv->Stop();
  }
  json out = json::array();
  for (size_t i : differing) {
    const StreamRun& a = replay[server][i];
    const StreamRun& b = replay["llama-matched"][i];
    json d = DivergenceOf(a.probabilities, b.probabilities);
    d["request"] = i;
    d["stream"] = w.requests[i].stream;
    // Texts can differ over the same tokens: llama-server streams a token only with its text, and
    // holds back a tail that is not valid UTF-8 for good, where skippy-server sends U+FFFD.
    d["same_tokens"] = !a.token_ids.empty() && a.token_ids == b.token_ids;
    const bool b_prefix = b.token_ids.size() <= a.token_ids.size() &&
                          std::equal(b.token_ids.begin(), b.token_ids.end(), a.token_ids.begin());
    // llama-server stopped sending tokens (an error event, or held-back text) but every token it sent
    // is Skippy's.
    d["withheld_tail"] = !d["same_tokens"].get<bool>() && b_prefix &&
                         (!b.error.empty() || (b.stop_type == a.stop_type &&
                                               b.tokens_predicted == static_cast<int>(a.token_ids.size())));
    d["errors"] = {a.error, b.error};
    d["tokens_reported"] = {a.token_ids.size(), b.token_ids.size()};
    d["tokens_predicted"] = {a.tokens_predicted, b.tokens_predicted};
    d["stop_type"] = {a.stop_type, b.stop_type};
    d["texts"] = {a.content, b.content};
    // The probe replays the timed run; say so when it did not give the same texts.
    d["reproduced"] = a.content == texts.at(server)[i] && b.content == texts.at("llama-matched")[i];
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

Status RenderServeCompare(const std::string& output_dir) {
  const fs::path in = fs::path(output_dir) / "serve-compare.json";
  std::ifstream f(in);
  if (!f) return absl::NotFoundError(StrCat("cannot read ", in.string()));
  json doc = json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("summary") || !doc["summary"].is_array() ||
      !doc.contains("concurrency_sweep") || !doc.contains("settings")) {
    return absl::InvalidArgumentError(StrCat(in.string(), " is not a serve-compare result"));
  }
  std::ofstream(fs::path(output_dir) / "serve-compare.md") << Markdown(doc);
  return absl::OkStatus();
}

json DivergenceOf(const json& a, const json& b) {
  auto id_at = [](const json& probs, size_t k) -> std::optional<int64_t> {
    if (!probs.is_array() || k >= probs.size() || !probs[k].contains("id")) return std::nullopt;
    return probs[k]["id"].get<int64_t>();
  };
  size_t k = 0;
  while (id_at(a, k) && id_at(b, k) && *id_at(a, k) == *id_at(b, k)) ++k;
  json d = {{"position", -1}, {"a", nullptr}, {"b", nullptr}, {"near_tie", false}};
  const auto ta = id_at(a, k), tb = id_at(b, k);
  if (!ta && !tb) return d;  // the same tokens throughout
  d["position"] = k;
  // This side's chosen token and its log-probability margin over the other side's choice.
  auto side = [&](const json& probs, int64_t own, std::optional<int64_t> other) {
    json e = {{"token", own}, {"gap", nullptr}};
    const json& entry = probs[k];
    if (!other || !entry.contains("logprob")) return e;
    for (const json& t : entry.value("top_logprobs", json::array())) {
      if (t.value("id", int64_t{-1}) == *other && t.contains("logprob")) {
        e["gap"] = entry["logprob"].get<double>() - t["logprob"].get<double>();
      }
    }
    return e;
  };
  if (ta) d["a"] = side(a, *ta, tb);
  if (tb) d["b"] = side(b, *tb, ta);
  d["near_tie"] = ta && tb && d["a"]["gap"].is_number() && d["b"]["gap"].is_number() &&
                  d["a"]["gap"].get<double>() < kNearTieNats && d["b"]["gap"].get<double>() < kNearTieNats;
  return d;
}

StatusOr<json> RunServeCompare(const ServeCompareOptions& o) {
  if (o.output_dir.empty()) return absl::InvalidArgumentError("--output-dir is required");
  if (o.repeats < 1 || o.lanes < 1) return absl::InvalidArgumentError("--repeats and --lanes must be at least 1");
  for (int c : o.concurrency_sweep) {
    if (c < 1 || c > 16) return absl::InvalidArgumentError(StrCat("concurrency level ", c, " outside [1, 16]"));
  }
  std::vector<std::string> names = o.workloads.empty() ? WorkloadNames() : o.workloads;
  std::vector<Workload> workloads;
  for (const std::string& n : names) {
    SKIPPY_ASSIGN_OR_RETURN(Workload w, MakeWorkload(n, o.workload));
    workloads.push_back(std::move(w));
  }
  for (const std::string& s : o.servers) SKIPPY_RETURN_IF_ERROR(ServerOptions(o, s, "", "").status());
  // Each case's model, checked before anything runs: a misspelt format must not cost a sweep.
  std::map<std::string, std::string> models;
  for (const std::string& key : o.cases) {
    SKIPPY_ASSIGN_OR_RETURN(const zoo::FamilySpec* family, zoo::FindFamily(key));
    std::string model = o.model_dir.empty() ? StrCat(o.zoo_dir, "/", zoo::ZooFileName(*family, o.zoo_format))
                                            : StrCat(o.model_dir, "/", key, ".gguf");
    if (!fs::is_regular_file(model)) {
      return absl::NotFoundError(StrCat(
          "no model file ", model,
          o.model_dir.empty() ? " (zoo formats are spelt as llama-quantize's types, e.g. F16, Q8_0, Q4_K_M, or ref; "
                                "skippy-zoo --format writes them)"
                              : ""));
    }
    models[key] = std::move(model);
  }
  const fs::path out(o.output_dir);
  std::error_code ec;
  fs::create_directories(out / "work", ec);
  if (ec) return absl::InvalidArgumentError(StrCat("cannot create ", o.output_dir));

  json doc = {{"version", 1}, {"machine", MachineInfo()}, {"synthetic_weights", o.model_dir.empty()},
              {"settings", {{"lanes", o.lanes}, {"threads", o.threads}, {"ctx_size", o.ctx_size}, {"batch_size", o.batch_size},
                            {"flash_attn", o.flash_attn}, {"llama_default_flash_attn", "auto (llama-server's default)"},
                            {"repeats", o.repeats}, {"think_ms", o.think_ms}, {"ttft_slo_ms", o.ttft_slo_ms}, {"tpot_slo_ms", o.tpot_slo_ms},
                            {"n_predict", o.workload.n_predict}, {"answer_tokens", o.workload.answer_tokens}, {"seed", o.workload.seed}, {"skippy_args", o.skippy_args},
                            {"zoo_format", o.model_dir.empty() ? o.zoo_format : ""}}},
              {"runs", json::array()}, {"summary", json::array()}, {"concurrency_sweep", json::array()}, {"charts", json::array()}};
  auto flush = [&] {
    std::ofstream(out / "serve-compare.json") << doc.dump(2) << "\n";
    std::ofstream(out / "serve-compare.md") << Markdown(doc);
  };
  for (const std::string& key : o.cases) {
    const std::string& model = models[key];
    if (!o.concurrency_sweep.empty()) {
      SKIPPY_ASSIGN_OR_RETURN(Workload sweep_w, MakeWorkload(o.sweep_workload, o.workload));
      // The sweep's clients send prompts as they are: no server restarts, no replies sent back.
      if (std::any_of(sweep_w.requests.begin(), sweep_w.requests.end(),
                      [](const WorkloadRequest& r) { return r.restart_before || r.after_reply; })) {
        return absl::InvalidArgumentError(StrCat("the ", o.sweep_workload, " workload cannot be a concurrency sweep's"));
      }
      for (int c : o.concurrency_sweep) {
        for (const std::string& server : o.servers) {
          std::fprintf(stderr, "[serve-compare] %s concurrency %d: %s\n", key.c_str(), c, server.c_str());
          ServeCompareOptions oc = o;
          oc.lanes = c;
          SKIPPY_ASSIGN_OR_RETURN(ModelServerOptions so,
                                  ServerOptions(oc, server, model, out / "work" / StrCat(key, "-sweep", c, "-", server, ".log")));
          json level = {{"family", key}, {"server", server}, {"concurrency", c}, {"workload", sweep_w.name}};
          auto srv = ModelServer::Start(so);
          if (!srv.ok()) {
            level["status"] = "error";
            level["error"] = std::string(srv.status().message());
            doc["concurrency_sweep"].push_back(level);
            flush();
            continue;
          }
          std::vector<StreamRun> results(sweep_w.requests.size());
          std::vector<std::pair<int, double>> sent(sweep_w.requests.size());  // client, ms after t0
          std::atomic<size_t> next{0};
          const auto t0 = SteadyClock::now();
          std::vector<std::thread> clients;
          for (int t = 0; t < c; ++t) {
            clients.emplace_back([&, t] {
              for (size_t i; (i = next.fetch_add(1)) < sweep_w.requests.size();) {
                sent[i] = {t, MsSince(t0)};
                results[i] = srv->StreamComplete(sweep_w.requests[i].prompt, sweep_w.requests[i].n_predict);
              }
            });
          }
          for (auto& th : clients) th.join();
          level["summary"] = Summarize(results, MsSince(t0) / 1000.0, o);
          // Each request's timeline, to tell waiting from computing: the server's own split of the
          // time (queue_ms, restore_ms, prompt_ms where it reports them) beside the client's.
          json reqs = json::array();
          for (size_t i = 0; i < results.size(); ++i) {
            const StreamRun& r = results[i];
            json t = json::object();
            for (const char* k : {"cache_n", "prompt_n", "prompt_ms"}) {
              if (r.timings.contains(k)) t[k] = r.timings[k];
            }
            for (const char* k : {"queue_ms", "prefix_wait_ms", "restore_ms"}) {
              if (r.skippy.contains(k)) t[k] = r.skippy[k];
            }
            reqs.push_back({{"stream", sweep_w.requests[i].stream}, {"client", sent[i].first}, {"sent_ms", sent[i].second},
                            {"ok", r.ok}, {"ttft_ms", r.ttft_ms}, {"e2e_ms", r.total_ms}, {"tokens", r.tokens},
                            {"tpot_ms", r.tpot_ms}, {"max_gap_ms", r.max_gap_ms}, {"timings", t}, {"error", r.error}});
          }
          level["requests"] = std::move(reqs);
          level["summary"]["peak_rss_bytes"] = srv->PeakRssBytes();
          // Unanswered requests lower its throughput and goodput; its latencies are of the others.
          level["status"] = "ok";
          if (const int n = level["summary"].value("unanswered", 0); n > 0) {
            level["status"] = "failed";
            level["error"] = StrCat(n, " of ", results.size(), " requests got no answer");
          }
          srv->Stop();
          doc["concurrency_sweep"].push_back(level);
          flush();
        }
      }
    }
    for (const Workload& w : workloads) {
      // server -> list of run summaries; and the generated texts of each server's first run.
      std::map<std::string, std::vector<json>> per_server;
      std::map<std::string, std::vector<std::string>> texts;
      for (int rep = 0; rep < o.repeats; ++rep) {
        for (size_t si = 0; si < o.servers.size(); ++si) {
          // Rotate the order every repeat: A B C, B C A, ... so no server always runs first.
          const std::string& server = o.servers[(si + static_cast<size_t>(rep)) % o.servers.size()];
          std::fprintf(stderr, "[serve-compare] %s %s repeat %d/%d: %s (%zu requests)\n", key.c_str(), w.name.c_str(), rep + 1,
                       o.repeats, server.c_str(), w.requests.size());
          SKIPPY_ASSIGN_OR_RETURN(ModelServerOptions so,
                                  ServerOptions(o, server, model, out / "work" / StrCat(key, "-", w.name, "-", server, ".log")));
          json run = {{"family", key}, {"workload", w.name}, {"server", server}, {"repeat", rep}};
          // A workload that restarts the server gives skippy-server a disk tier, fresh for each run:
          // what it serves after the restart is what this run's first server wrote.
          const bool restarts = std::any_of(w.requests.begin(), w.requests.end(),
                                            [](const WorkloadRequest& r) { return r.restart_before; });
          if (restarts && server == "skippy") {
            const fs::path cache_dir = out / "work" / StrCat(key, "-", w.name, "-rep", rep, "-cache");
            fs::remove_all(cache_dir, ec);
            so.extra_args.insert(so.extra_args.end(), {"--cache-dir", cache_dir.string()});
            run["cache_dir"] = cache_dir.string();
          }
          auto srv = ModelServer::Start(so);
          if (!srv.ok()) {
            run["status"] = "error";
            run["error"] = std::string(srv.status().message());
            doc["runs"].push_back(run);
            flush();
            continue;
          }
          std::vector<StreamRun> results;
          json reqs = json::array();
          const auto t0 = SteadyClock::now();
          double excluded_ms = 0;  // restarts and think time: not counted in wall time
          uint64_t peak_rss = 0;
          ReplyChain chain;
          for (const WorkloadRequest& req : w.requests) {
            if (req.restart_before) {
              const auto r0 = SteadyClock::now();
              peak_rss = std::max(peak_rss, srv->PeakRssBytes());
              srv->Stop();
              srv = ModelServer::Start(so);
              excluded_ms += MsSince(r0);
              if (!srv.ok()) break;
            }
            if (req.after_reply && o.think_ms > 0) {
              const auto p0 = SteadyClock::now();
              std::this_thread::sleep_for(std::chrono::milliseconds(o.think_ms));
              excluded_ms += MsSince(p0);
            }
            const std::string prompt = chain.PromptFor(req);
            StreamRun r = srv->StreamComplete(prompt, req.n_predict);
            chain.Answered(req, prompt, r.content);
            reqs.push_back({{"stream", req.stream}, {"phase", req.phase}, {"ok", r.ok}, {"ttft_ms", r.ttft_ms},
                            {"e2e_ms", r.total_ms}, {"tokens", r.tokens}, {"cache_n", r.timings.value("cache_n", -1)},
                            {"prompt_n", r.timings.value("prompt_n", -1)}, {"content", r.content}, {"error", r.error}});
            results.push_back(std::move(r));
          }
          if (!srv.ok()) {
            run["status"] = "error";
            run["error"] = StrCat("restart: ", srv.status().message());
            doc["runs"].push_back(run);
            flush();
            continue;
          }
          const double wall_s = (MsSince(t0) - excluded_ms) / 1000.0;
          // Per phase; the headline phase's requests make the run's summary.
          std::map<std::string, std::vector<StreamRun>> phases;
          for (size_t i = 0; i < results.size(); ++i) {
            if (!w.requests[i].phase.empty()) phases[w.requests[i].phase].push_back(results[i]);
          }
          // A phase's wall time: its requests' end-to-end times (they run one after another).
          auto phase_wall_s = [](const std::vector<StreamRun>& rs) {
            double ms = 0;
            for (const StreamRun& r : rs) ms += r.total_ms;
            return ms / 1000.0;
          };
          for (const auto& [phase, rs] : phases) run["phases"][phase] = Summarize(rs, phase_wall_s(rs), o);
          run["summary"] = w.headline_phase.empty()
                               ? Summarize(results, wall_s, o)
                               : Summarize(phases[w.headline_phase], phase_wall_s(phases[w.headline_phase]), o);
          run["summary"]["peak_rss_bytes"] = std::max(peak_rss, srv->PeakRssBytes());
          run["requests"] = reqs;
          srv->Stop();
          // A request without an answer has no latency to count: the run is reported as failed and
          // stays out of the medians, or a server that fails fast would look fast.
          const auto unanswered = std::find_if(results.begin(), results.end(), [](const StreamRun& r) { return !r.ok; });
          if (unanswered != results.end()) {
            const auto n = std::count_if(results.begin(), results.end(), [](const StreamRun& r) { return !r.ok; });
            run["status"] = "failed";
            run["error"] = StrCat(n, " of ", results.size(), " requests got no answer; the first: ", unanswered->error);
            std::fprintf(stderr, "[serve-compare] %s %s: %s: %s\n", key.c_str(), w.name.c_str(), server.c_str(),
                         run["error"].get<std::string>().c_str());
            doc["runs"].push_back(run);
            flush();
            continue;
          }
          run["status"] = "ok";
          json kept = run["summary"];
          if (run.contains("phases")) kept["phases"] = run["phases"];
          per_server[server].push_back(kept);
          if (!texts.count(server)) {
            for (const StreamRun& r : results) texts[server].push_back(r.content);
          }
          doc["runs"].push_back(run);
          flush();
        }
      }
      for (const std::string& server : o.servers) {
        const auto& runs = per_server[server];
        if (runs.empty()) continue;
        auto med = [&](const char* k) {
          std::vector<double> v;
          for (const json& r : runs) v.push_back(r.value(k, 0.0));
          return Median(v);
        };
        json s = {{"family", key}, {"workload", w.name}, {"server", server}, {"runs", runs.size()},
                  {"ttft_p50_ms", med("ttft_p50_ms")}, {"ttft_p95_ms", med("ttft_p95_ms")},
                  {"e2e_p50_ms", med("e2e_p50_ms")}, {"e2e_p95_ms", med("e2e_p95_ms")},
                  {"goodput_rps", med("goodput_rps")}, {"throughput_rps", med("throughput_rps")},
                  {"prompt_tokens_reused", runs[0].value("prompt_tokens_reused", int64_t{0})},
                  {"prompt_tokens_recomputed", runs[0].value("prompt_tokens_recomputed", int64_t{0})},
                  {"peak_rss_bytes", runs[0].value("peak_rss_bytes", uint64_t{0})}};
        if (!w.headline_phase.empty()) s["headline_phase"] = w.headline_phase;
        if (runs[0].contains("phases")) {
          for (const auto& [phase, _] : runs[0]["phases"].items()) {
            std::vector<double> v;
            for (const json& r : runs) v.push_back(r["phases"][phase].value("ttft_p50_ms", 0.0));
            s["phases_ttft_p50_ms"][phase] = Median(v);
          }
        }
        if (texts.count("llama-matched") && server != "llama-matched" && texts.count(server)) {
          const auto& a = texts[server];
          const auto& b = texts["llama-matched"];
          size_t same = 0, compared = 0;
          std::vector<size_t> differing;
          // With replies in the prompts, a request compares only while its stream's earlier
          // replies agreed: after that the two servers were sent different prompts.
          std::set<std::string> parted;
          for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
            const WorkloadRequest& req = w.requests[i];
            if (req.after_reply && parted.count(req.stream)) continue;
            ++compared;
            if (a[i] == b[i]) {
              ++same;
            } else {
              differing.push_back(i);
              parted.insert(req.stream);
            }
          }
          s["agreement"] = StrCat(same, "/", compared);
          if (server == "skippy" && !differing.empty()) {
            std::fprintf(stderr, "[serve-compare] %s %s: %zu outputs differ from llama-matched; replaying with n_probs\n",
                         key.c_str(), w.name.c_str(), differing.size());
            s["disagreements"] = ExplainDisagreements(o, key, model, w, server, differing, texts, out / "work");
          }
        }
        doc["summary"].push_back(s);
      }
      flush();
    }
    // Charts: TTFT p50 by workload per server, and goodput by clients per server.
    BarChart ttft{StrCat(key, ": TTFT p50 by workload (ms, lower is better)"), "TTFT p50 ms", {}, {}, false, 0};
    for (const std::string& server : o.servers) ttft.series.push_back({server, {}});
    for (const Workload& w : workloads) {
      ttft.categories.push_back(w.name);
      for (ChartSeries& series : ttft.series) {
        double v = NAN;
        for (const json& r : doc["summary"]) {
          if (r["family"] == key && r["workload"] == w.name && r["server"] == series.name) v = r.value("ttft_p50_ms", NAN);
        }
        series.values.push_back(v);
      }
    }
    if (auto c = DrawBarChart(out.string(), StrCat("ttft-", key), ttft); c.ok()) doc["charts"].push_back(*c);
    if (!o.concurrency_sweep.empty()) {
      BarChart good{StrCat(key, ": goodput by concurrent clients (requests/s meeting the TTFT SLO)"), "goodput rps", {}, {}, false, 0};
      for (const std::string& server : o.servers) good.series.push_back({server, {}});
      for (int c : o.concurrency_sweep) {
        good.categories.push_back(StrCat(c, " client", c > 1 ? "s" : ""));
        for (ChartSeries& series : good.series) {
          double v = NAN;
          for (const json& l : doc["concurrency_sweep"]) {
            if (l["family"] == key && l["concurrency"] == c && l["server"] == series.name && l.contains("summary")) {
              v = l["summary"].value("goodput_rps", NAN);
            }
          }
          series.values.push_back(v);
        }
      }
      if (auto c = DrawBarChart(out.string(), StrCat("goodput-", key), good); c.ok()) doc["charts"].push_back(*c);
    }
    flush();
  }
  return doc;
}

}  // namespace skippy::bench
