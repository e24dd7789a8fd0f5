// zerocheck plan's outputs: a terminal table, JSON, and one self-contained HTML page with SVG plots
// (memory per plan as stacked bars by category; the step time split).
#include "plan/plan.h"

#include "reports/svg.h"
#include "reports/text.h"

#include <fmt/format.h>

#include <algorithm>

namespace zc::plan {

namespace {

std::string ms(double us) { return fmt::format("{:.1f} ms", us / 1e3); }

// "   NCCL Ring/LL128 96 (41.2 ms), Ring/Simple 24 (3.1 ms)": NCCL's choices for these calls.
std::string nccl_choices_text(const CollectiveFigure& c) {
  std::string out;
  for (const sim::NcclCalls& n : c.nccl) {
    out += fmt::format("{}{}/{} {} ({})", out.empty() ? "   NCCL " : ", ", sim::nccl_algo_name(n.algo),
                       sim::nccl_proto_name(n.proto), n.calls, ms(n.us));
  }
  return out;
}

std::string with_commas(std::int64_t v) {
  std::string s = std::to_string(v), out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

nlohmann::json categories(const MemBytes& b) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t k = 0; k < kMemCategories; ++k) {
    if (b[k] != 0) j[std::string(mem_category_name(static_cast<MemCategory>(k)))] = b[k];
  }
  return j;
}

}  // namespace

std::string to_text(const PlanResult& r) {
  std::string out = fmt::format(
      "zerocheck plan: {} ({} params) on {} x {} ({} per node, {} between nodes)\n", r.model_name,
      with_commas(r.params), r.options.world, r.gpu_name, r.gpus_per_node, r.network_name);
  out += fmt::format("config: {}; simulated {} of {} ranks in meta mode\n\n", r.config_summary,
                     r.simulated_ranks.size(), r.options.world);
  out += fmt::format("memory of rank {} at its step peak (the largest rank){:>12}{:>14}\n",
                     r.worst_rank, "GPU", "CPU");
  for (std::size_t k = 0; k < kMemCategories; ++k) {
    if (r.device.at_peak[k] == 0 && r.cpu.at_peak[k] == 0) continue;
    out += fmt::format("  {:<48}{:>12}{:>14}\n", mem_category_name(static_cast<MemCategory>(k)),
                       format_bytes(r.device.at_peak[k]), format_bytes(r.cpu.at_peak[k]));
  }
  out += fmt::format("  {:<48}{:>12}{:>14}\n", "peak during the steps", format_bytes(r.device.peak),
                     format_bytes(r.cpu.peak));
  out += fmt::format("  {:<48}{:>12}{:>14}\n", "peak during construction",
                     format_bytes(r.device.construction_peak), format_bytes(r.cpu.construction_peak));
  const std::string why = fit_message(r);
  out += fmt::format("  {}\n\n", why.empty() ? fmt::format("fits in {} ({} of it used)",
                                                           format_bytes(r.memory_budget),
                                                           format_bytes(std::max(r.device.peak, r.device.construction_peak)))
                                             : why);
  out += fmt::format("collectives per step (rank {}; timed by {})\n", r.worst_rank, r.collective_model);
  for (const CollectiveFigure& c : r.collectives) {
    out += fmt::format("  {:<16}{:>8} calls{:>14}{}\n", collective_name(c.kind), c.calls, format_bytes(c.bytes),
                       nccl_choices_text(c));
  }
  out += "\nstep time (predicted, Note [Plan time model])\n";
  out += fmt::format("  compute                 {:>12}\n", ms(r.compute_us));
  out += fmt::format("  communication           {:>12}   blocked in collectives {}, overlapped {}\n",
                     ms(r.comm_us), ms(r.exposed_comm_us), ms(r.overlap_us));
  if (r.offload_us > 0) out += fmt::format("  offload (CPU Adam, PCIe){:>12}\n", ms(r.offload_us));
  out += fmt::format("  step                    {:>12}   {:.0f} tokens/s over the cluster, MFU {:.1f}%{}\n",
                     ms(r.step_us), r.tokens_per_s, 100 * r.mfu,
                     r.recompute_flops_per_step > 0
                         ? fmt::format(" (the recomputation's {:.1f}% more FLOPs not counted)",
                                       100.0 * static_cast<double>(r.recompute_flops_per_step) /
                                           static_cast<double>(r.flops_per_step - r.recompute_flops_per_step))
                         : std::string());
  return out;
}

nlohmann::json to_json(const PlanResult& r) {
  nlohmann::json colls = nlohmann::json::array();
  for (const CollectiveFigure& c : r.collectives) {
    nlohmann::json nccl = nlohmann::json::array();
    for (const sim::NcclCalls& n : c.nccl) {
      nccl.push_back({{"algorithm", sim::nccl_algo_name(n.algo)}, {"protocol", sim::nccl_proto_name(n.proto)},
                      {"calls", n.calls}, {"bytes", n.bytes}, {"time_us", n.us}});
    }
    colls.push_back({{"kind", collective_name(c.kind)}, {"calls", c.calls}, {"bytes", c.bytes}, {"nccl", nccl}});
  }
  auto mem = [](const MemoryFigures& m) {
    nlohmann::json timeline = nlohmann::json::array();
    for (const MemSample& t : m.timeline) timeline.push_back({{"event", t.event}, {"live", categories(t.live)}});
    nlohmann::json steps = nlohmann::json::array();
    for (const StepMemory& s : m.per_step) {
      steps.push_back({{"peak_bytes", s.peak}, {"after_forward_bytes", s.after_forward},
                       {"after_step_bytes", s.after_step}});
    }
    return nlohmann::json{{"peak_bytes", m.peak},
                          {"steps", steps},
                          {"timeline", timeline},
                          {"construction_peak_bytes", m.construction_peak},
                          {"at_peak", categories(m.at_peak)},
                          {"category_peaks", categories(m.category_peaks)},
                          {"peak_set_by", m.peak_label}};
  };
  return {{"schema", "zerocheck-plan/1"},
          {"model", {{"name", r.model_name}, {"params", r.params}, {"largest_param", r.largest_param},
                     {"seq", r.seq},
                     {"attention", r.options.model.attention == AttentionMemory::fused ? "fused" : "materialised"},
                     {"gradient_checkpointing", r.options.model.gradient_checkpointing},
                     {"checkpoint_function", r.options.model.checkpoint_function == CheckpointFunction::deepspeed
                                                 ? "deepspeed.checkpointing" : "torch.utils.checkpoint"}}},
          {"cluster", {{"world", r.options.world}, {"gpus_per_node", r.gpus_per_node}, {"gpu", r.gpu_name},
                       {"network", r.network_name}, {"simulated_ranks", r.simulated_ranks.size()},
                       {"representative", r.representative},
                       {"schedule", std::string(sim::schedule_name(r.schedule))}}},
          {"config", {{"stage", r.stage}, {"dtype", r.dtype}, {"offload", r.offload},
                      {"micro_batch", r.micro_batch}, {"gradient_accumulation_steps", r.ga},
                      {"global_batch", r.global_batch()},
                      {"experts", r.experts}, {"ep_size", r.ep_size}}},
          {"worst_rank", r.worst_rank},
          {"config_warnings", r.warnings},
          {"memory", {{"gpu", mem(r.device)}, {"cpu", mem(r.cpu)}, {"gpu_capacity_bytes", r.device_capacity},
                      {"budget_bytes", r.memory_budget},
                      {"fits", r.fits}, {"message", fit_message(r)}}},
          {"collectives_per_step", colls},
          {"collective_model", r.collective_model},
          {"time_us", {{"step", r.step_us}, {"compute", r.compute_us}, {"communication", r.comm_us},
                       {"exposed_communication", r.exposed_comm_us}, {"overlapped", r.overlap_us},
                       {"offload", r.offload_us}}},
          {"flops_per_step", r.flops_per_step},
          {"recompute_flops_per_step", r.recompute_flops_per_step},
          {"kernels_per_step", r.kernels_per_step},
          {"tokens_per_s", r.tokens_per_s},
          {"mfu", r.mfu}};
}

namespace {

constexpr std::array<std::string_view, kMemCategories> kColors = {
    "#1f6fb4", "#ff7f0e", "#2e9c4a", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#c7c7c7"};

std::string label_of(const PlanResult& r) {
  return fmt::format("ZeRO-{} {} x{} mb{}", r.stage, r.offload == "none" ? "" : "off:" + r.offload,
                     r.options.world, r.micro_batch);
}

// Horizontal stacked bars, one per plan: the composition of its GPU peak.
std::string memory_plot(const std::vector<PlanResult>& plans) {
  using namespace reports;
  const double left = 250, width = 480, top = 30, pitch = 24;
  double max_v = 1;
  for (const PlanResult& p : plans) {
    max_v = std::max({max_v, static_cast<double>(p.device.peak), static_cast<double>(p.device_capacity)});
  }
  const Axis axis = nice_axis(max_v / (1024.0 * 1024 * 1024), false);
  const double height = top + pitch * static_cast<double>(plans.size()) + 80;
  Svg svg("plan-memory", left + width + 30, height, "GPU memory at the step peak, by category");
  svg.text(8, 18, "GPU memory at the step peak, by category (GiB)", Anchor::start, 13, "#222", true);
  const Box panel{left, top, width, pitch * static_cast<double>(plans.size())};
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const PlanResult& p = plans[i];
    const double y = top + static_cast<double>(i) * pitch + 5;
    svg.text(left - 6, y + 11, fit_text(label_of(p), left - 12, 11), Anchor::end);
    double x = left;
    for (std::size_t k = 0; k < kMemCategories; ++k) {
      const double gib = static_cast<double>(p.device.at_peak[k]) / (1024.0 * 1024 * 1024);
      const double w = width * gib / axis.max;
      if (w <= 0) continue;
      svg.rect({x, y, w, 14}, Paint{kColors[k], "none"}, "mem",
               fmt::format("{}: {}", mem_category_name(static_cast<MemCategory>(k)),
                           format_bytes(p.device.at_peak[k])));
      x += w;
    }
    const double cap = left + width * (static_cast<double>(p.device_capacity) / (1024.0 * 1024 * 1024)) / axis.max;
    svg.line(cap, y - 3, cap, y + 17, "#d62728", true);
  }
  svg.x_value_axis(panel, axis, "GiB (dashed: the GPU's capacity)");
  Legend legend;
  for (std::size_t k = 0; k < kMemCategories - 1; ++k) {
    legend.push_back({Paint{kColors[k], "none"}, std::string(mem_category_name(static_cast<MemCategory>(k)))});
  }
  svg.legend(8, height - 22, Legend(legend.begin(), legend.begin() + 6));
  svg.legend(8, height - 6, Legend(legend.begin() + 6, legend.end()));
  return svg.finish();
}

// The first plan's GPU memory over its steps: one stacked column per timeline sample.
std::string timeline_plot(const PlanResult& p) {
  using namespace reports;
  const std::vector<MemSample>& t = p.device.timeline;
  if (t.empty()) return "";
  const double left = 60, width = 660, top = 30, height = 200;
  const Axis axis = nice_axis(std::max(1.0, static_cast<double>(p.device.peak) / (1024.0 * 1024 * 1024)), false);
  Svg svg("plan-timeline", left + width + 20, top + height + 50, "GPU memory over the steps, by category");
  svg.text(8, 18, fmt::format("GPU memory of rank {} over the steps, by category (GiB)", p.worst_rank),
           Anchor::start, 13, "#222", true);
  const Box panel{left, top, width, height};
  const double w = width / static_cast<double>(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    double y = top + height;
    for (std::size_t k = 0; k < kMemCategories; ++k) {
      const double h = height * (static_cast<double>(t[i].live[k]) / (1024.0 * 1024 * 1024)) / axis.max;
      if (h <= 0) continue;
      y -= h;
      svg.rect({left + w * static_cast<double>(i), y, w, h}, Paint{kColors[k], "none"}, "tl",
               fmt::format("event {}: {} {}", t[i].event, mem_category_name(static_cast<MemCategory>(k)),
                           format_bytes(t[i].live[k])));
    }
  }
  svg.y_value_axis(panel, axis, "GiB");
  svg.text(left + width / 2, top + height + 30, "allocation / free events (sampled)", Anchor::middle);
  return svg.finish();
}

std::string time_plot(const std::vector<PlanResult>& plans) {
  using namespace reports;
  const double left = 250, width = 480, top = 30, pitch = 24;
  double max_v = 1;
  for (const PlanResult& p : plans) max_v = std::max(max_v, p.step_us / 1e3);
  const Axis axis = nice_axis(max_v, false);
  const double height = top + pitch * static_cast<double>(plans.size()) + 64;
  Svg svg("plan-time", left + width + 30, height, "Predicted step time");
  svg.text(8, 18, "Predicted step time (ms)", Anchor::start, 13, "#222", true);
  const Box panel{left, top, width, pitch * static_cast<double>(plans.size())};
  const std::array<Paint, 4> paints = {Paint{"#1f6fb4", "none"}, Paint{"#d62728", "none"},
                                       Paint{"#ff7f0e", "none"}, Paint{"#a7b4c2", "none"}};
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const PlanResult& p = plans[i];
    const double y = top + static_cast<double>(i) * pitch + 5;
    svg.text(left - 6, y + 11, fit_text(label_of(p), left - 12, 11), Anchor::end);
    const double other = std::max(0.0, p.step_us - p.compute_us - p.exposed_comm_us - p.offload_us);
    const std::array<std::pair<double, const char*>, 4> parts = {
        {{p.compute_us, "compute"}, {p.exposed_comm_us, "exposed communication"},
         {p.offload_us, "offload (CPU, PCIe)"}, {other, "idle"}}};
    double x = left;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const double w = width * (parts[k].first / 1e3) / axis.max;
      if (w <= 0) continue;
      svg.rect({x, y, w, 14}, paints[k], "time", fmt::format("{}: {:.1f} ms", parts[k].second, parts[k].first / 1e3));
      x += w;
    }
  }
  svg.x_value_axis(panel, axis, "ms per step");
  svg.legend(8, height - 8, {{paints[0], "compute"}, {paints[1], "exposed communication"},
                             {paints[2], "offload (CPU Adam, PCIe)"}, {paints[3], "idle (waiting on peers)"}});
  return svg.finish();
}

}  // namespace

std::string to_html(const std::vector<PlanResult>& plans, const std::string& title) {
  using reports::xml_escape;
  // The verdict first: one plan opens with its banner, several (--fit) with their table.
  std::string head;
  if (plans.size() == 1) {
    const PlanResult& p = plans.front();
    const std::string why = fit_message(p);
    head = fmt::format("<p class=\"verdict {}\">{}</p>\n<p>{}; {}</p>\n", p.fits ? "fits" : "nofit",
                       xml_escape(why.empty() ? fmt::format("fits: rank {} needs {} of {}", p.worst_rank,
                                                            format_bytes(std::max(p.device.peak, p.device.construction_peak)),
                                                            format_bytes(p.memory_budget))
                                              : why),
                       xml_escape(p.config_summary), xml_escape(fmt::format("{:.1f} ms per step, {:.0f} tokens/s",
                                                                            p.step_us / 1e3, p.tokens_per_s)));
  } else if (!plans.empty()) {
    head = "<table><tr><th>stage</th><th>offload</th><th>micro-batch</th><th>global batch</th><th>GPU peak</th>"
           "<th>fits</th><th>step</th><th>tokens/s</th></tr>\n";
    for (const PlanResult& p : plans) {
      head += fmt::format("<tr class=\"{}\"><td>ZeRO-{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                          "<td>{:.1f} ms</td><td>{:.0f}</td></tr>\n", p.fits ? "fits" : "nofit", p.stage,
                          xml_escape(p.offload), p.micro_batch, p.global_batch(),
                          format_bytes(std::max(p.device.peak, p.device.construction_peak)), p.fits ? "yes" : "no",
                          p.step_us / 1e3, p.tokens_per_s);
    }
    head += "</table>\n";
  }
  std::string body;
  for (const PlanResult& p : plans) body += "<pre>" + xml_escape(to_text(p)) + "</pre>\n";
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title>\n"
      "<style>body{{font-family:sans-serif;margin:2em;max-width:70em}}pre{{background:#f6f8fa;"
      "padding:1em;overflow-x:auto}}svg{{max-width:100%;height:auto}}.verdict{{font-size:1.3em;padding:.5em;"
      "border-radius:4px}}.verdict.fits{{background:#e6f4ea}}.verdict.nofit{{background:#fce8e6}}"
      "table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2em .5em;text-align:right}}"
      "tr.nofit{{color:#888}}</style></head>\n<body><h1>{0}</h1>\n{5}<figure>{1}</figure>\n"
      "<figure>{2}</figure>\n<figure>{4}</figure>\n{3}</body></html>\n",
      xml_escape(title), memory_plot(plans), time_plot(plans), body,
      plans.empty() ? std::string() : timeline_plot(plans.front()), head);
}

}  // namespace zc::plan
