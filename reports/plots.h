// The three plots of report.html, each one inline <svg> drawn by reports/svg.h: collectives per
// step (baseline vs coalesced, by N, one panel per ZeRO stage), cases and seconds per invariant,
// and the time to catch each known bug. Every data bar is a <rect> whose class starts with "bar",
// in the order of the report's vectors, with its value in a <title> tooltip.
#pragma once

#include "props/verify_report.h"

#include <string>
#include <vector>

namespace zc::reports {

// id "plot-collectives"; bars of class "bar baseline" and "bar coalesced".
std::string collectives_plot(const std::vector<props::CollectivePoint>& points);
// id "plot-invariants"; bars of class "bar cases" and "bar seconds", one of each per invariant.
std::string invariants_plot(const std::vector<props::InvariantResult>& invariants);
// id "plot-bugs"; one bar per bug, class "bar caught" or "bar not-caught".
std::string bugs_plot(const std::vector<props::BugResult>& bugs);

}  // namespace zc::reports
