// The report's plots (plots.h). Layout is fixed arithmetic on counts and estimated text widths;
// bar lengths are value / axis.max times the panel's length, so bars of one panel compare.
#include "reports/plots.h"

#include "reports/svg.h"
#include "reports/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace zc::reports {

namespace {

constexpr Paint kBaseline{"#a7b4c2", "none"};
constexpr Paint kCoalesced{"#1f6fb4", "none"};
constexpr Paint kHolds{"#1f6fb4", "none"};
constexpr Paint kFails{"#d62728", "none"};
constexpr Paint kCaught{"#2e9c4a", "none"};
constexpr Paint kNotCaught{"none", "#d62728", true};
constexpr std::string_view kRed = "#d62728";

constexpr double kBarThickness = 14;
constexpr double kRowPitch = 24;

double nonnegative(double v) { return std::isfinite(v) && v > 0 ? v : 0.0; }

std::string empty_plot(std::string_view id, std::string_view title, std::string_view why) {
  Svg svg(id, 520, 56, title);
  svg.text(8, 20, title, Anchor::start, 13, "#222", true);
  svg.text(8, 42, why, Anchor::start);
  return svg.finish();
}

// A horizontal bar in row `row` of `panel`, with `label` inside its end when it fits there and
// just past its end otherwise.
struct HBar {
  double value = 0;
  Paint paint;
  std::string cls;
  std::string tooltip;
  std::string label;
  std::string_view label_fill = "#222";
  bool label_bold = false;
};

void draw_hbar(Svg& svg, const Box& panel, const Axis& axis, std::size_t row, const HBar& bar) {
  const double w = panel.w * nonnegative(bar.value) / axis.max;
  const double y = panel.y + static_cast<double>(row) * kRowPitch + (kRowPitch - kBarThickness) / 2;
  svg.rect({panel.x, y, w, kBarThickness}, bar.paint, bar.cls, bar.tooltip);
  if (bar.label.empty()) return;
  const bool inside = bar.paint.fill != "none" && w >= text_width(bar.label, 10) + 8;
  if (inside) {
    svg.text(panel.x + w - 4, y + kBarThickness - 3.5, bar.label, Anchor::end, 10, "#fff");
  } else {
    svg.text(panel.x + w + 4, y + kBarThickness - 3.5, bar.label, Anchor::start, 10, bar.label_fill,
             bar.label_bold);
  }
}

// Row labels right-aligned against `right`, one per row of the panels that start at `top`.
void row_labels(Svg& svg, double right, double top, double width,
                const std::vector<std::string>& labels) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const double y = top + static_cast<double>(i) * kRowPitch + kRowPitch / 2 + 4;
    svg.text(right, y, fit_text(labels[i], width, 11), Anchor::end);
  }
}

double label_column(const std::vector<std::string>& labels, double min_w, double max_w) {
  double w = 0;
  for (const std::string& l : labels) w = std::max(w, text_width(l, 11));
  return std::clamp(w + 12, min_w, max_w);
}

template <typename T>
std::vector<T> sorted_unique(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

std::string collectives_plot(const std::vector<props::CollectivePoint>& points) {
  const std::string title = "Collectives per optimizer step, baseline vs coalesced";
  if (points.empty()) {
    return empty_plot("plot-collectives", title, "No collective counts in this run.");
  }
  std::vector<int> stages, ns;
  double top_value = 0;
  for (const props::CollectivePoint& p : points) {
    stages.push_back(p.stage);
    ns.push_back(p.n_backward);
    top_value = std::max({top_value, nonnegative(p.baseline), nonnegative(p.coalesced)});
  }
  stages = sorted_unique(std::move(stages));
  ns = sorted_unique(std::move(ns));
  const Axis axis = nice_axis(top_value, true);
  constexpr double left = 64, top = 76, panel_h = 180, panel_gap = 56, bottom = 56, bar_w = 14;
  const double group_w = 2 * bar_w + 16;
  const double panel_w = std::max(120.0, static_cast<double>(ns.size()) * group_w);
  const auto n_panels = static_cast<double>(stages.size());
  const Legend legend = {{kBaseline, "baseline (one reduction per backward)"},
                         {kCoalesced, "coalesced (one pass per step)"}};
  const double width = std::max({left + legend_width(legend), text_width(title, 13) + left + 8,
                                 left + n_panels * panel_w + (n_panels - 1) * panel_gap + 24});
  const double height = top + panel_h + bottom;
  Svg svg("plot-collectives", width, height, title);
  svg.text(left, 18, title, Anchor::start, 13, "#222", true);
  svg.legend(left, 38, legend);
  for (std::size_t si = 0; si < stages.size(); ++si) {
    const Box b{left + static_cast<double>(si) * (panel_w + panel_gap), top, panel_w, panel_h};
    svg.text(b.x + b.w / 2, b.y - 8, fmt::format("ZeRO-{}", stages[si]), Anchor::middle, 11, "#222",
             true);
    svg.y_value_axis(b, axis, si == 0 ? "collectives per step" : "");
    const double slot = b.w / static_cast<double>(ns.size());
    for (std::size_t ni = 0; ni < ns.size(); ++ni) {
      svg.text(b.x + (static_cast<double>(ni) + 0.5) * slot, b.y + b.h + 15,
               fmt::format("{}", ns[ni]), Anchor::middle, 10, "#444");
    }
    for (const props::CollectivePoint& p : points) {
      if (p.stage != stages[si]) continue;
      const auto ni =
          static_cast<double>(std::find(ns.begin(), ns.end(), p.n_backward) - ns.begin());
      const double cx = b.x + (ni + 0.5) * slot;
      const double hb = b.h * nonnegative(p.baseline) / axis.max;
      const double hc = b.h * nonnegative(p.coalesced) / axis.max;
      const std::string where = fmt::format("ZeRO-{}, N = {}", p.stage, p.n_backward);
      svg.rect({cx - bar_w - 1, b.y + b.h - hb, bar_w, hb}, kBaseline, "bar baseline",
               fmt::format("{}: baseline issues {:g} collectives per step", where, p.baseline));
      svg.rect({cx + 1, b.y + b.h - hc, bar_w, hc}, kCoalesced, "bar coalesced",
               fmt::format("{}: coalesced issues {:g} collectives per step", where, p.coalesced));
    }
  }
  svg.text(width / 2, height - 12, "N (backward chunks per optimizer step)", Anchor::middle);
  return svg.finish();
}

std::string invariants_plot(const std::vector<props::InvariantResult>& invariants) {
  const std::string title = "Cases and seconds per invariant";
  if (invariants.empty()) return empty_plot("plot-invariants", title, "No invariants in this run.");
  std::vector<std::string> names;
  double most_cases = 0, most_seconds = 0;
  for (const props::InvariantResult& i : invariants) {
    names.push_back(i.name);
    most_cases = std::max(most_cases, static_cast<double>(std::max(i.cases, 0)));
    most_seconds = std::max(most_seconds, nonnegative(i.seconds));
  }
  const double label_w = label_column(names, 60, 220);
  constexpr double top = 76, panel_w = 260, panel_gap = 44, bottom = 48, right = 40;
  const double left = label_w + 8;
  const double rows_h = static_cast<double>(invariants.size()) * kRowPitch;
  const double width = left + 2 * panel_w + panel_gap + right;
  Svg svg("plot-invariants", width, top + rows_h + bottom, title);
  svg.text(8, 18, title, Anchor::start, 13, "#222", true);
  svg.legend(left, 38, {{kHolds, "holds"}, {kFails, "does not hold"}});
  const Box cases_box{left, top, panel_w, rows_h};
  const Box seconds_box{left + panel_w + panel_gap, top, panel_w, rows_h};
  const Axis cases_axis = nice_axis(most_cases, true);
  const Axis seconds_axis = nice_axis(most_seconds, false);
  svg.text(cases_box.x, top - 8, "scenarios checked", Anchor::start, 11, "#222", true);
  svg.text(seconds_box.x, top - 8, "wall seconds", Anchor::start, 11, "#222", true);
  svg.x_value_axis(cases_box, cases_axis, "cases");
  svg.x_value_axis(seconds_box, seconds_axis, "seconds");
  row_labels(svg, left - 8, top, label_w - 4, names);
  for (std::size_t row = 0; row < invariants.size(); ++row) {
    const props::InvariantResult& i = invariants[row];
    const Paint paint = i.holds ? kHolds : kFails;
    const std::string state = i.holds ? "holds" : "DOES NOT HOLD";
    draw_hbar(svg, cases_box, cases_axis, row,
              {.value = static_cast<double>(i.cases),
               .paint = paint,
               .cls = "bar cases",
               .tooltip = fmt::format("{}: {} cases, {} discarded; {}", i.name, i.cases,
                                      i.discarded, state),
               .label = fmt::format("{}", i.cases)});
    draw_hbar(svg, seconds_box, seconds_axis, row,
              {.value = i.seconds,
               .paint = paint,
               .cls = "bar seconds",
               .tooltip = fmt::format("{}: {:.2f} s; {}", i.name, i.seconds, state),
               .label = seconds_label(i.seconds) + " s"});
  }
  return svg.finish();
}

std::string bugs_plot(const std::vector<props::BugResult>& bugs) {
  const std::string title = "Time to catch each known bug (label: scenarios run until caught)";
  if (bugs.empty()) return empty_plot("plot-bugs", title, "No known bugs were run.");
  std::vector<std::string> ids;
  double most_seconds = 0;
  for (const props::BugResult& b : bugs) {
    ids.push_back(b.id);
    most_seconds = std::max(most_seconds, nonnegative(b.seconds));
  }
  const double label_w = label_column(ids, 40, 160);
  constexpr double top = 60, panel_w = 380, bottom = 48, right = 96;
  const double left = label_w + 8;
  const double rows_h = static_cast<double>(bugs.size()) * kRowPitch;
  const Legend legend = {{kCaught, "caught"}, {kNotCaught, "not caught (bar: time spent trying)"}};
  const double width =
      std::max({left + legend_width(legend), text_width(title, 13) + 16, left + panel_w + right});
  Svg svg("plot-bugs", width, top + rows_h + bottom, title);
  svg.text(8, 18, title, Anchor::start, 13, "#222", true);
  svg.legend(left, 40, legend);
  const Box box{left, top, panel_w, rows_h};
  const Axis axis = nice_axis(most_seconds, false);
  svg.x_value_axis(box, axis, "seconds until caught and shrunk");
  row_labels(svg, left - 8, top, label_w - 4, ids);
  for (std::size_t row = 0; row < bugs.size(); ++row) {
    const props::BugResult& b = bugs[row];
    HBar bar;
    bar.value = b.seconds;
    bar.paint = b.caught ? kCaught : kNotCaught;
    if (b.caught) {
      bar.cls = "bar caught";
      bar.tooltip = fmt::format("{} caught by {} after {} cases, {:.2f} s ({} shrink steps): {}",
                                b.id, b.by, b.cases_to_catch, b.seconds, b.shrink_steps, b.summary);
      bar.label = fmt::format("{} case{}", b.cases_to_catch, b.cases_to_catch == 1 ? "" : "s");
    } else {
      bar.cls = "bar not-caught";
      bar.tooltip = fmt::format("{} NOT CAUGHT after {:.2f} s (expected: {}): {}", b.id, b.seconds,
                                b.expected_by, b.summary);
      bar.label = "NOT CAUGHT";
      bar.label_fill = kRed;
      bar.label_bold = true;
    }
    draw_hbar(svg, box, axis, row, bar);
  }
  return svg.finish();
}

}  // namespace zc::reports
