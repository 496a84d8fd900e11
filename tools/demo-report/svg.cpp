#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "render.hpp"

namespace thaw::demo {

namespace {

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#x27;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A round axis step: 1, 2 or 5 times a power of ten, at most 10 ticks over SPAN.
double axis_step(double span) {
  for (double m :
       {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0}) {
    if (span / m <= 10) return m;
  }
  return 1e9;
}

}  // namespace

std::string svg(const std::vector<Run>& runs, const std::string& title,
                const std::vector<std::string>& notes) {
  const int left = 230, right = 30, top = 60, lane_h = 56, width = 1000;
  const int lanes = static_cast<int>(runs.size());
  double span = 0;
  for (const auto& r : runs) span = std::max({span, r.total_s, r.fetch_s.value_or(0.0)});
  if (span == 0) span = 1.0;
  const double step = axis_step(span);
  const int ticks = static_cast<int>(span / step) + 1;
  span = ticks * step;
  const double scale = (width - left - right) / span;
  const int legend_y = top + lane_h * lanes + 40;
  const int height = legend_y + 40 + 18 * static_cast<int>(notes.size());
  auto x = [&](double t) { return left + t * scale; };

  std::vector<std::string> out{
      fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" )"
                  R"(font-family="sans-serif" font-size="13">)",
                  width, height),
      R"(<rect width="100%" height="100%" fill="white"/>)",
      fmt::format(R"(<text x="{}" y="24" font-size="16" font-weight="bold">{}</text>)", left,
                  escape(title)),
  };
  const int axis_y = top + lane_h * lanes + 6;
  for (int i = 0; i <= ticks; ++i) {
    double t = i * step;
    out.push_back(fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/>)",
                              x(t), top - 6, x(t), axis_y));
    out.push_back(
        fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle" fill="#444">{:g} s</text>)",
                    x(t), axis_y + 16, std::round(t * 1e6) / 1e6));
  }
  for (int i = 0; i < lanes; ++i) {
    const Run& r = runs[i];
    const int y = top + i * lane_h;
    out.push_back(
        fmt::format(R"(<text class="lane" x="{}" y="{}" text-anchor="end">({}) {}</text>)",
                    left - 10, y + 28, r.id, escape(r.label)));
    if (r.fetch_s) {
      out.push_back(fmt::format(R"(<rect x="{:.1f}" y="{}" width="{:.1f}" height="12" fill="{}">)"
                                R"(<title>fetch {:.3f} s</title></rect>)",
                                x(0), y + 4, std::max(1.0, *r.fetch_s * scale), kFetchColour,
                                *r.fetch_s));
    }
    double t = r.engine_start_s;
    for (size_t p = 0; p < kPhases.size(); ++p) {
      double d = r.phase_s[p];
      if (d > 0) {
        out.push_back(fmt::format(R"(<rect x="{:.1f}" y="{}" width="{:.1f}" height="24" fill="{}">)"
                                  R"(<title>{} {:.3f} s</title></rect>)",
                                  x(t), y + 20, std::max(1.0, d * scale), kPhases[p].colour,
                                  kPhases[p].heading, d));
      }
      t += d;
    }
    out.push_back(fmt::format(R"(<text x="{:.1f}" y="{}" fill="#222">{:.2f} s</text>)",
                              x(r.total_s) + 5, y + 37, r.total_s));
  }
  int lx = left;
  auto legend = [&](std::string_view name, std::string_view colour) {
    out.push_back(fmt::format(R"(<rect x="{}" y="{}" width="14" height="14" fill="{}"/>)", lx,
                              legend_y, colour));
    out.push_back(fmt::format(R"(<text x="{}" y="{}">{}</text>)", lx + 19, legend_y + 12, name));
    lx += 30 + 8 * static_cast<int>(name.size());
  };
  legend("fetch", kFetchColour);
  for (const auto& p : kPhases) legend(p.heading, p.colour);
  for (size_t j = 0; j < notes.size(); ++j) {
    out.push_back(fmt::format(R"(<text x="{}" y="{}" fill="#444" font-size="12">{}</text>)", left,
                              legend_y + 38 + 18 * static_cast<int>(j), escape(notes[j])));
  }
  out.push_back("</svg>");
  std::string text;
  for (size_t i = 0; i < out.size(); ++i) text += (i ? "\n" : "") + out[i];
  return text + "\n";
}

}  // namespace thaw::demo
