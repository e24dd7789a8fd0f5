// A small SVG writer for the report's plots: shapes with <title> tooltips, value axes with 1-2-5
// ticks, and legends. Every string that reaches the output is XML-escaped; every coordinate is
// finite (a non-finite value is drawn as 0), so the document stays well-formed whatever the data.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zc::reports {

// A value axis from 0 to max in ticks of step (1, 2 or 5 times a power of ten).
struct Axis {
  double max = 1;
  double step = 0.2;
};
// The smallest such axis covering max_value with about five ticks; integer_steps for counts.
Axis nice_axis(double max_value, bool integer_steps);
std::string tick_label(double value, const Axis& axis);

// The plot area of one panel, in SVG user units (pixels), y growing downwards.
struct Box {
  double x = 0, y = 0, w = 0, h = 0;
};

struct Paint {
  std::string_view fill = "none";
  std::string_view stroke = "none";
  bool dashed = false;
};

enum class Anchor { start, middle, end };

// Estimated width of s in a sans-serif font of `size` pixels; for layout, not for measurement.
double text_width(std::string_view s, double size);
// s cut to fit `width` pixels, ending in an ellipsis when cut.
std::string fit_text(std::string_view s, double width, double size);

using Legend = std::vector<std::pair<Paint, std::string>>;  // (swatch, label) entries
// The width Svg::legend draws `entries` in.
double legend_width(const Legend& entries);

class Svg {
 public:
  // id: the element's id in the page; title: the figure's accessible name and tooltip.
  Svg(std::string_view id, double width, double height, std::string_view title);

  void rect(const Box& b, const Paint& paint, std::string_view cls, std::string_view tooltip);
  void line(double x1, double y1, double x2, double y2, std::string_view stroke,
            bool dashed = false);
  void text(double x, double y, std::string_view s, Anchor anchor, double size = 11,
            std::string_view fill = "#222", bool bold = false);
  // Text turned 90 degrees counter-clockwise around (x, y), for a vertical axis label.
  void vertical_text(double x, double y, std::string_view s, double size = 11);

  // Value axis along the bottom of `b` (horizontal bars): ticks, numbers, grid lines, label.
  void x_value_axis(const Box& b, const Axis& axis, std::string_view label);
  // Value axis along the left of `b` (vertical bars): ticks, numbers, grid lines, label.
  void y_value_axis(const Box& b, const Axis& axis, std::string_view label);
  // A row of (swatch, label) entries starting at (x, y).
  void legend(double x, double y, const Legend& entries);

  std::string finish();

 private:
  std::string out_;
  bool finished_ = false;
};

}  // namespace zc::reports
