// skippy-bench report: renders README-ready evidence from production-cache-bench.json files.
//
// Sections (as the README shows them): "Full-GGUF llama-server vs Skippy", "Use-Case Benchmark Matrix" (rows: use
// cases, columns: families), the use-case source table, and "Package-only". Rows and columns keep
// the family table's order; a family whose correctness failed is left out of the promoted tables
// and listed with its reason; missing cells are "-"; table cells escape '|'. Every table is
// labelled as synthetic-weight when its rows came from the zoo. Charts (speedup by family and by
// use case) are drawn with gnuplot into PNG files beside the markdown.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "skippy/common/status.h"

namespace skippy::bench {

struct ReportOptions {
  std::vector<std::string> inputs;  // production-cache-bench.json files
  std::string output;               // readme-tables.md
  bool charts = true;
  std::string gnuplot = "gnuplot";
};

// Pure rendering of already-loaded documents (tested on fixed inputs).
std::string RenderReport(const std::vector<nlohmann::json>& docs, const std::vector<std::string>& chart_files);

// Loads the inputs, renders, writes the markdown and the charts. InvalidArgument / NotFound for bad
// inputs. A missing gnuplot is not an error: the report says the charts were not drawn.
StatusOr<std::string> WriteReport(const ReportOptions& options);

// A Markdown table cell's text: "|" escaped, line breaks as spaces.
std::string MarkdownCell(std::string_view text);

}  // namespace skippy::bench
