// The SVG writer behind the report's plots (svg.h). Coordinates are printed with two decimals,
// so a bar's length is its value times the axis scale to within 0.005 px.
#include "reports/svg.h"

#include "engine/errors.h"
#include "reports/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace zc::reports {

namespace {

double finite(double v) { return std::isfinite(v) ? v : 0.0; }

std::string num(double v) { return fmt::format("{:.2f}", finite(v)); }

std::string_view anchor_name(Anchor a) {
  switch (a) {
    case Anchor::start:
      return "start";
    case Anchor::middle:
      return "middle";
    case Anchor::end:
      return "end";
  }
  return "start";
}

std::string paint_attributes(const Paint& p) {
  std::string s =
      fmt::format(R"(fill="{}" stroke="{}")", xml_escape(p.fill, true), xml_escape(p.stroke, true));
  if (p.dashed) s += R"( stroke-width="1.5" stroke-dasharray="4 3")";
  return s;
}

// Number of code points, counting each invalid byte as one.
std::size_t glyphs(std::string_view s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u;
  return n;
}

int tick_count(const Axis& axis) { return static_cast<int>(std::lround(axis.max / axis.step)); }

}  // namespace

Axis nice_axis(double max_value, bool integer_steps) {
  const double top = std::isfinite(max_value) && max_value > 0 ? max_value : 1.0;
  const double raw = top / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * magnitude;
  if (integer_steps) step = std::max(step, 1.0);
  // The tolerance keeps 200 on a 50-step axis at 200, not 250, despite rounding in top / step.
  const double ticks = std::ceil(top / step - 1e-9);
  ZC_ASSERT(ticks >= 1 && ticks <= 10, "axis for {} with step {} has {} ticks", top, step, ticks);
  return {ticks * step, step};
}

std::string tick_label(double value, const Axis& axis) {
  if (axis.step >= 1) return fmt::format("{:.0f}", value);
  const int decimals = static_cast<int>(std::ceil(-std::log10(axis.step) - 1e-9));
  return fmt::format("{:.{}f}", value, decimals);
}

double text_width(std::string_view s, double size) {
  return 0.6 * size * static_cast<double>(glyphs(s));
}

std::string fit_text(std::string_view s, double width, double size) {
  if (text_width(s, size) <= width) return std::string(s);
  const auto keep = static_cast<std::size_t>(std::max(0.0, width / (0.6 * size) - 1));
  std::string out;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const bool starts_glyph = (static_cast<unsigned char>(s[i]) & 0xC0u) != 0x80u;
    if (starts_glyph && kept++ == keep) break;
    out += s[i];
  }
  return out + "\xE2\x80\xA6";  // U+2026
}

Svg::Svg(std::string_view id, double width, double height, std::string_view title) {
  out_ = fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" id="{}" width="{}" height="{}" )"
                     R"(viewBox="0 0 {} {}" font-family="DejaVu Sans, Arial, sans-serif" )"
                     R"(font-size="11" role="img">)"
                     "\n<title>{}</title>\n",
                     xml_escape(id, true), num(width), num(height), num(width), num(height),
                     xml_escape(title));
}

void Svg::rect(const Box& b, const Paint& paint, std::string_view cls, std::string_view tooltip) {
  out_ += fmt::format(R"(<rect class="{}" x="{}" y="{}" width="{}" height="{}" {}>)",
                      xml_escape(cls, true), num(b.x), num(b.y), num(std::max(0.0, finite(b.w))),
                      num(std::max(0.0, finite(b.h))), paint_attributes(paint));
  if (!tooltip.empty()) out_ += fmt::format("<title>{}</title>", xml_escape(tooltip));
  out_ += "</rect>\n";
}

void Svg::line(double x1, double y1, double x2, double y2, std::string_view stroke, bool dashed) {
  out_ += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}"{}/>)"
                      "\n",
                      num(x1), num(y1), num(x2), num(y2), xml_escape(stroke, true),
                      dashed ? R"( stroke-dasharray="2 3")" : "");
}

void Svg::text(double x, double y, std::string_view s, Anchor anchor, double size,
               std::string_view fill, bool bold) {
  out_ += fmt::format(R"(<text x="{}" y="{}" text-anchor="{}" font-size="{}" fill="{}"{}>{}</text>)"
                      "\n",
                      num(x), num(y), anchor_name(anchor), num(size), xml_escape(fill, true),
                      bold ? R"( font-weight="bold")" : "", xml_escape(s));
}

void Svg::vertical_text(double x, double y, std::string_view s, double size) {
  out_ += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" font-size="{}" fill="#222" )"
                      R"svg(transform="rotate(-90 {} {})">{}</text>)svg"
                      "\n",
                      num(x), num(y), num(size), num(x), num(y), xml_escape(s));
}

void Svg::x_value_axis(const Box& b, const Axis& axis, std::string_view label) {
  const double bottom = b.y + b.h;
  for (int k = 0; k <= tick_count(axis); ++k) {
    const double v = k * axis.step;
    const double x = b.x + b.w * v / axis.max;
    if (v > 0) line(x, b.y, x, bottom, "#ddd", true);
    line(x, bottom, x, bottom + 4, "#444");
    text(x, bottom + 15, tick_label(v, axis), Anchor::middle, 10, "#444");
  }
  line(b.x, bottom, b.x + b.w, bottom, "#444");
  line(b.x, b.y, b.x, bottom, "#444");
  text(b.x + b.w / 2, bottom + 30, label, Anchor::middle);
}

void Svg::y_value_axis(const Box& b, const Axis& axis, std::string_view label) {
  const double bottom = b.y + b.h;
  double widest = 0;
  for (int k = 0; k <= tick_count(axis); ++k) {
    const double v = k * axis.step;
    const double y = bottom - b.h * v / axis.max;
    if (v > 0) line(b.x, y, b.x + b.w, y, "#ddd", true);
    line(b.x - 4, y, b.x, y, "#444");
    const std::string t = tick_label(v, axis);
    widest = std::max(widest, text_width(t, 10));
    text(b.x - 6, y + 3.5, t, Anchor::end, 10, "#444");
  }
  line(b.x, b.y, b.x, bottom, "#444");
  line(b.x, bottom, b.x + b.w, bottom, "#444");
  if (!label.empty()) vertical_text(b.x - widest - 14, b.y + b.h / 2, label);
}

namespace {

double legend_entry_width(const std::string& label) { return 17 + text_width(label, 11) + 18; }

}  // namespace

double legend_width(const Legend& entries) {
  double w = 0;
  for (const auto& entry : entries) w += legend_entry_width(entry.second);
  return w;
}

void Svg::legend(double x, double y, const Legend& entries) {
  for (const auto& [paint, label] : entries) {
    rect({x, y - 9, 12, 10}, paint, "swatch", "");
    text(x + 17, y, label, Anchor::start);
    x += legend_entry_width(label);
  }
}

std::string Svg::finish() {
  ZC_ASSERT(!finished_, "Svg::finish called twice");
  finished_ = true;
  out_ += "</svg>\n";
  return std::move(out_);
}

}  // namespace zc::reports
