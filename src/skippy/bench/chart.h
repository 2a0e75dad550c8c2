// Bar charts as PNG files, drawn by gnuplot (pngcairo). One chart = categories on the x axis and
// one or more named series (clustered bars). Data and script files are written beside the PNG so a
// chart can be re-drawn or restyled by hand.
#pragma once

#include <string>
#include <vector>

#include "skippy/common/status.h"

namespace skippy::bench {

struct ChartSeries {
  std::string name;
  std::vector<double> values;  // one per category; NaN = missing
};

struct BarChart {
  std::string title;
  std::string ylabel;
  std::vector<std::string> categories;
  std::vector<ChartSeries> series;
  bool log_y = false;
  double reference_line = 0;  // draw a dashed line at this y when > 0 (e.g. speedup 1x)
};

// Writes DIR/NAME.png (plus NAME.dat, NAME.gp). NotFound when there is no data; Unavailable when
// gnuplot fails or is missing (the message quotes its error).
StatusOr<std::string> DrawBarChart(const std::string& dir, const std::string& name, const BarChart& chart,
                                   const std::string& gnuplot = "gnuplot");

}  // namespace skippy::bench
