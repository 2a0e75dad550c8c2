#include "skippy/bench/chart.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "skippy/common/strings.h"
#include "skippy/common/subprocess.h"

namespace skippy::bench {

namespace fs = std::filesystem;

namespace {

std::string Quote(std::string s) {
  std::string out;
  for (char c : s) out += (c == '"' || c == '\'') ? ' ' : c;
  return out;
}

}  // namespace

StatusOr<std::string> DrawBarChart(const std::string& dir_s, const std::string& name, const BarChart& c,
                                   const std::string& gnuplot) {
  if (c.categories.empty() || c.series.empty()) return absl::NotFoundError("no data");
  const fs::path dir(dir_s);
  const fs::path dat = dir / (name + ".dat"), gp = dir / (name + ".gp"), png = dir / (name + ".png"),
                 log = dir / (name + ".gnuplot.log");
  {
    std::ofstream d(dat);
    d << "category";
    for (const ChartSeries& s : c.series) d << " \"" << Quote(s.name) << '"';
    d << "\n";
    for (size_t i = 0; i < c.categories.size(); ++i) {
      d << '"' << Quote(c.categories[i]) << '"';
      for (const ChartSeries& s : c.series) {
        const double v = i < s.values.size() ? s.values[i] : NAN;
        d << ' ' << (std::isnan(v) ? std::string("?") : fmt::format("{:.6g}", v));
      }
      d << "\n";
    }
  }
  {
    std::ofstream g(gp);
    g << "set terminal pngcairo size 1100,500 font 'sans,10'\n"
      << "set output '" << png.string() << "'\n"
      << "set title '" << Quote(c.title) << "'\n"
      << "set datafile missing '?'\n"
      << "set style data histograms\nset style histogram clustered gap 1\n"
      << "set style fill solid 0.85 border -1\nset boxwidth 0.9\n"
      << "set ylabel '" << Quote(c.ylabel) << "'\nset grid ytics\nset xtics rotate by -30 left\n"
      << (c.series.size() > 1 ? "set key outside right top\n" : "unset key\n");
    if (c.log_y) g << "set logscale y\n";
    g << "set yrange [" << (c.log_y ? "0.1" : "0") << ":*]\n";
    if (c.reference_line > 0) {
      g << "set arrow from graph 0, first " << c.reference_line << " to graph 1, first " << c.reference_line
        << " nohead dt 2 lc rgb '#aa0000'\n";
    }
    g << "plot ";
    for (size_t i = 0; i < c.series.size(); ++i) {
      g << (i ? ", " : "") << "'" << dat.string() << "' using " << i + 2 << (i == 0 ? ":xtic(1)" : "") << " title columnheader";
    }
    g << "\n";
  }
  const std::string cmd = StrCat(gnuplot, " '", gp.string(), "' 2>'", log.string(), "'");
  if (std::system(cmd.c_str()) != 0 || !fs::exists(png)) {
    return absl::UnavailableError(StrCat("gnuplot failed: ", TailOfFile(log.string(), 300)));
  }
  fs::remove(log);
  return png.filename().string();
}

}  // namespace skippy::bench
