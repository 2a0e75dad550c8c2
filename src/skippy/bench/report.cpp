#include "skippy/bench/report.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "skippy/bench/chart.h"
#include "skippy/cache/family_policy.h"
#include "skippy/common/stats.h"
#include "skippy/common/strings.h"
#include "skippy/common/subprocess.h"

namespace skippy::bench {

using nlohmann::json;
namespace fs = std::filesystem;

std::string MarkdownCell(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

namespace {

std::string Num(const json& r, const char* key, int prec, const char* suffix = "") {
  if (!r.contains(key) || !r[key].is_number()) return "-";
  return fmt::format("{:.{}f}{}", r[key].get<double>(), prec, suffix);
}

std::string Notes(const json& r) {
  std::string n;
  for (const auto& x : r.value("notes", json::array())) {
    if (x.is_string()) n += (n.empty() ? "" : "; ") + x.get<std::string>();
  }
  return n;
}

int FamilyOrder(const std::string& key) {
  const auto fams = cache::KnownFamilies();
  for (size_t i = 0; i < fams.size(); ++i) {
    if (fams[i].key == key) return static_cast<int>(i);
  }
  return 1000;
}

bool Promoted(const json& r) { return r.value("status", "") == "ok"; }

// What the certifier timed as a hit, from the run's settings (skippy-correctness flags).
std::string HitWhat(const json& settings) {
  std::string what = settings.value("hits_from_disk", false) ? "read from the disk tier + restore" : "restore";
  if (settings.value("borrow_resident_hits", false)) what = "restore once, then cut the lane back to the prefix";
  what += settings.value("cache_decoded_result_hits", false) ? " + copy of the continuation's stored logits (no decode)"
                                                              : " + decode of the continuation";
  return what;
}


}  // namespace

std::string RenderReport(const std::vector<json>& docs, const std::vector<std::string>& chart_files) {
  std::vector<json> full, uses;
  std::vector<json> use_case_meta;
  bool synthetic = false;
  std::set<std::string> presets;
  json machine, settings;
  for (const json& d : docs) {
    synthetic = synthetic || d.value("synthetic_weights", false);
    if (!d.value("zoo_preset", std::string()).empty()) {
      const std::string format = d.value("zoo_format", std::string("F16"));
      presets.insert(StrCat(d.value("zoo_preset", std::string()), format == "F16" ? "" : StrCat(", weights ", format)));
    }
    if (machine.is_null() && d.contains("machine")) machine = d["machine"];
    if (settings.is_null() && d.contains("settings")) settings = d["settings"];
    for (const json& r : d.value("rows", json::array())) (r.contains("use_case") ? uses : full).push_back(r);
    for (const json& u : d.value("use_cases", json::array())) {
      if (std::none_of(use_case_meta.begin(), use_case_meta.end(), [&](const json& m) { return m["key"] == u["key"]; })) {
        use_case_meta.push_back(u);
      }
    }
  }
  auto by_family = [](const json& a, const json& b) {
    const int fa = FamilyOrder(a.value("key", "")), fb = FamilyOrder(b.value("key", ""));
    if (fa != fb) return fa < fb;
    return a.value("prefix_tokens", 0) < b.value("prefix_tokens", 0);
  };
  std::stable_sort(full.begin(), full.end(), by_family);

  std::string md = "# Skippy evidence tables\n\n";
  if (synthetic) {
    std::string preset_list;
    for (const auto& p : presets) preset_list += (preset_list.empty() ? "" : ", ") + StrCat("`", p, "`");
    md += StrCat("> **Synthetic weights.** Every row below comes from a skippy-zoo model (preset ", preset_list,
                 "): the family's real llama.cpp architecture, tensor layout and tokenizer with deterministic random "
                 "weights. The numbers measure cache speed and exactness, not model quality; the \"Model ref\" column "
                 "names the real model each synthetic one stands in for.\n\n");
  }
  if (!machine.is_null()) {
    md += StrCat("Machine: ", machine.value("cpu", std::string("?")), ", ", machine.value("nproc", 0), " cores; llama.cpp ",
                 machine.value("llama_cpp_commit", std::string("?")).substr(0, 12), ".");
  }
  if (!settings.is_null()) {
    md += StrCat(" Settings: ", settings.value("threads", 0), " threads, ctx ", settings.value("ctx_size", 0), ", flash attention ",
                 settings.value("flash_attn", false) ? "on" : "off", ", one generated token, llama-server --parallel ",
                 settings.value("llama_parallel", 1), ", Skippy lanes ", settings.value("runtime_lane_count", 1), ".");
  }
  md += StrCat("\nSpeedup = llama-server warm median (runs 2..N, timed at the client over HTTP) / Skippy hit median (",
               HitWhat(settings.is_null() ? json::object() : settings), ", in-process)");
  if (const int rounds = settings.is_null() ? 1 : settings.value("rounds", 1); rounds > 1) {
    md += StrCat(", each the median of ", rounds,
                 " rounds' medians, the two sides taking turns (llama-server first in every second round)");
  }
  md += ". Cache bytes are measured.\n\n";

  // --- Full-GGUF -------------------------------------------------------------------------------
  md += "## Full-GGUF llama-server vs Skippy\n\n";
  md += "| Family | Model ref | Payload | Correctness | Prefix tokens | Prompt tokens | llama-server warm median ms | "
        "Skippy hit median ms | Speedup | Cache bytes | Size method | Notes |\n";
  md += "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|\n";
  std::vector<json> left_out;
  for (const json& r : full) {
    if (r.value("package_only", false)) continue;
    if (!Promoted(r)) {
      left_out.push_back(r);
      continue;
    }
    md += StrCat("| ", MarkdownCell(r.value("family", "")), " | ", MarkdownCell(r.value("model_ref", "")), " | ",
                 MarkdownCell(r.value("payload", "")), " | ", MarkdownCell(r.value("correctness", "")), " | ",
                 r.value("prefix_tokens", 0), " | ",
                 r.value("benchmark_prompt_token_count", 0), " | ", Num(r, "llama_server_warm_median_ms", 2), " | ",
                 Num(r, "skippy_hit_median_ms", 2), " | ", Num(r, "speedup", 2, "x"), " | ",
                 std::to_string(r.value("cache_bytes", uint64_t{0})), " | ", MarkdownCell(r.value("cache_bytes_method", "")), " | ",
                 MarkdownCell(Notes(r)), " |\n");
  }
  if (!left_out.empty()) {
    md += "\nLeft out of the table (not promoted):\n\n";
    for (const json& r : left_out) {
      md += StrCat("- ", MarkdownCell(r.value("family", "")), " (prefix ", r.value("prefix_tokens", 0), "): ", r.value("status", ""),
                   Notes(r).empty() ? "" : " - " + MarkdownCell(Notes(r)), "\n");
    }
  }

  // --- Use-case matrix ---------------------------------------------------------------------------
  if (!uses.empty()) {
    std::vector<std::string> fam_keys;
    std::map<std::string, std::string> fam_names;
    for (const auto& row : cache::KnownFamilies()) {
      if (row.package_only) continue;
      if (std::any_of(uses.begin(), uses.end(), [&](const json& r) { return r.value("key", "") == row.key; })) {
        fam_keys.emplace_back(row.key);
        fam_names[std::string(row.key)] = std::string(row.display_name);
      }
    }
    md += "\n## Use-Case Benchmark Matrix\n\nCells: speedup (llama-server warm median / Skippy hit median); "
          "\"-\" where the row is missing or not promoted.\n\n| Use case |";
    for (const auto& k : fam_keys) md += " " + MarkdownCell(fam_names[k]) + " |";
    md += "\n|---|";
    for (size_t i = 0; i < fam_keys.size(); ++i) md += "---:|";
    md += "\n";
    std::vector<std::string> uc_keys;
    for (const json& m : use_case_meta) uc_keys.push_back(m.value("key", ""));
    for (const json& r : uses) {
      const std::string k = r.value("use_case", "");
      if (std::find(uc_keys.begin(), uc_keys.end(), k) == uc_keys.end()) uc_keys.push_back(k);
    }
    std::vector<json> uc_left_out;
    for (const std::string& uk : uc_keys) {
      std::string label = uk;
      for (const json& m : use_case_meta) if (m.value("key", "") == uk) label = m.value("label", uk);
      md += "| " + MarkdownCell(label) + " |";
      for (const auto& fk : fam_keys) {
        std::string cell = "-";
        for (const json& r : uses) {
          if (r.value("key", "") != fk || r.value("use_case", "") != uk) continue;
          if (Promoted(r)) cell = Num(r, "speedup", 2, "x");
          else uc_left_out.push_back(r);
        }
        md += " " + cell + " |";
      }
      md += "\n";
    }
    if (!uc_left_out.empty()) {
      md += "\nNot promoted:\n\n";
      for (const json& r : uc_left_out) {
        md += StrCat("- ", MarkdownCell(r.value("family", "")), " / ", MarkdownCell(r.value("use_case", "")), ": ",
                     r.value("status", ""), Notes(r).empty() ? "" : " - " + MarkdownCell(Notes(r)), "\n");
      }
    }
    md += "\n### Use-case sources\n\nPrompts are our own, written in the spirit of the named dataset row "
          "(`evals/skippy-usecase-corpus.json`); prompt tokens vary with each family's tokenizer.\n\n"
          "| Key | Use case | Dataset | Config | Split | Row | Prefix tokens | Prompt tokens |\n"
          "|---|---|---|---|---|---:|---:|---:|\n";
    for (const json& m : use_case_meta) {
      int lo = 0, hi = 0;
      for (const json& r : uses) {
        if (r.value("use_case", "") != m.value("key", "")) continue;
        const int n = r.value("benchmark_prompt_token_count", 0);
        if (n <= 0) continue;
        lo = lo == 0 ? n : std::min(lo, n);
        hi = std::max(hi, n);
      }
      const json& s = m.value("source", json::object());
      md += StrCat("| ", MarkdownCell(m.value("key", "")), " | ", MarkdownCell(m.value("label", "")), " | ",
                   MarkdownCell(s.value("dataset", "")), " | ", MarkdownCell(s.value("config", "")), " | ",
                   MarkdownCell(s.value("split", "")), " | ", s.value("row_idx", 0), " | ",
                   m.value("prefix_tokens", 0), " | ", lo == hi ? std::to_string(lo) : StrCat(lo, "-", hi), " |\n");
    }
  }

  // --- Package-only ------------------------------------------------------------------------------
  std::vector<json> pkg;
  for (const json& r : full) if (r.value("package_only", false)) pkg.push_back(r);
  if (!pkg.empty()) {
    md += "\n## Package-only\n\nBaseline: Skippy's own recompute of the same stage (prefill of the prefix + "
          "continuation, the first round's certification); a monolithic llama-server baseline of the full real model does not fit this machine. "
          "The llama-server column is the synthetic stand-in served by llama-server, for reference.\n\n"
          "| Family | Model ref | Payload | Correctness | Prefix tokens | Skippy recompute ms | Skippy hit median ms | "
          "Speedup vs recompute | llama-server warm median ms | Cache bytes | Notes |\n"
          "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|\n";
    for (const json& r : pkg) {
      const json& s = r.value("skippy", json::object());
      // A row that did not pass (certification, llama-server) shows why, and no numbers.
      const bool ok = Promoted(r);
      const double recompute = s.value("recompute_total_ms", 0.0), hit = r.value("skippy_hit_median_ms", 0.0);
      md += StrCat("| ", MarkdownCell(r.value("family", "")), " | ", MarkdownCell(r.value("model_ref", "")), " | ",
                   MarkdownCell(r.value("payload", "")), " | ", MarkdownCell(r.value("correctness", "")), " | ",
                   r.value("prefix_tokens", 0), " | ", ok ? Num(s, "recompute_total_ms", 2) : "-", " | ",
                   ok ? Num(r, "skippy_hit_median_ms", 2) : "-", " | ",
                   ok && hit > 0 ? fmt::format("{:.2f}x", recompute / hit) : "-", " | ",
                   ok ? Num(r, "llama_server_warm_median_ms", 2) : "-", " | ",
                   ok ? std::to_string(r.value("cache_bytes", uint64_t{0})) : "-", " | ", MarkdownCell(Notes(r)), " |\n");
    }
  }

  if (!chart_files.empty()) {
    md += "\n## Charts\n\n";
    for (const std::string& c : chart_files) md += StrCat("![", fs::path(c).stem().string(), "](", c, ")\n\n");
  }
  return md;
}


StatusOr<std::string> WriteReport(const ReportOptions& o) {
  if (o.inputs.empty()) return absl::InvalidArgumentError("no --input files");
  if (o.output.empty()) return absl::InvalidArgumentError("--output is required");
  std::vector<json> docs;
  for (const std::string& path : o.inputs) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(StrCat("cannot read ", path));
    json d = json::parse(in, nullptr, false);
    if (d.is_discarded() || !d.is_object() || !d.contains("rows") || !d["rows"].is_array()) {
      return absl::InvalidArgumentError(StrCat(path, " is not a production-cache-bench.json (no rows array)"));
    }
    // One report, one header: its settings and weights line must hold for every row.
    if (!docs.empty()) {
      const json& first = docs.front();
      if (d.value("synthetic_weights", false) != first.value("synthetic_weights", false)) {
        return absl::InvalidArgumentError(StrCat(path, " and ", o.inputs.front(),
                                                 " mix synthetic and real weights: render them apart"));
      }
      json a = d.value("settings", json::object()), b = first.value("settings", json::object());
      a.erase("zoo_preset");  // several presets are named in the header
      b.erase("zoo_preset");
      if (a != b) {
        return absl::InvalidArgumentError(StrCat(path, " was measured with other settings than ", o.inputs.front(), ": ",
                                                 json::diff(b, a).dump()));
      }
    }
    docs.push_back(std::move(d));
  }
  const fs::path dir = fs::absolute(o.output).parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::vector<std::string> charts;
  std::string chart_note;
  if (o.charts) {
    std::vector<std::pair<std::string, double>> fam, uc;
    std::map<std::string, std::vector<double>> per_uc;
    std::map<std::string, std::string> uc_label;
    std::vector<std::string> uc_order;
    std::vector<json> rows;
    for (const json& d : docs) for (const json& r : d["rows"]) rows.push_back(r);
    for (const auto& fr : cache::KnownFamilies()) {
      for (const json& r : rows) {
        if (r.value("key", "") == fr.key && !r.contains("use_case") && Promoted(r) && !fr.package_only &&
            r.value("prefix_tokens", 0) == 128) {
          fam.emplace_back(std::string(fr.display_name), r.value("speedup", 0.0));
        }
      }
    }
    for (const json& r : rows) {
      if (!r.contains("use_case") || !Promoted(r) || r.value("package_only", false)) continue;
      const std::string k = r.value("use_case", "");
      if (!per_uc.count(k)) uc_order.push_back(k);
      per_uc[k].push_back(r.value("speedup", 0.0));
      uc_label[k] = r.value("use_case_label", k);
    }
    for (const std::string& k : uc_order) uc.emplace_back(uc_label[k] + " (median)", Median(per_uc[k]));
    auto draw = [&](const char* name, const char* title, const std::vector<std::pair<std::string, double>>& bars) {
      BarChart chart{title, "speedup (x, log scale)", {}, {{"speedup", {}}}, /*log_y=*/true, /*reference_line=*/1.0};
      for (const auto& [label, v] : bars) {
        chart.categories.push_back(label);
        chart.series[0].values.push_back(v);
      }
      auto c = DrawBarChart(dir.string(), name, chart, o.gnuplot);
      if (c.ok()) charts.push_back(*c);
      else if (c.status().code() != absl::StatusCode::kNotFound) chart_note = std::string(c.status().message());
    };
    draw("speedup-by-family", "Skippy hit vs llama-server warm, by family (128-token prefix)", fam);
    draw("speedup-by-use-case", "Median speedup across families, by use case", uc);
  }
  std::string md = RenderReport(docs, charts);
  if (!chart_note.empty()) md += StrCat("\nCharts were not drawn: ", chart_note, "\n");
  std::ofstream out(o.output);
  out << md;
  if (!out) return absl::InternalError(StrCat("cannot write ", o.output));
  return md;
}

}  // namespace skippy::bench
