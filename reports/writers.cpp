// results.json and write_all, which creates the output directory and writes the four files.
#include "reports/writers.h"

#include "engine/errors.h"
#include "reports/text.h"

#include <fmt/format.h>

#include <system_error>

namespace zc::reports {

void write_json(const props::VerifyReport& r, const std::filesystem::path& file) {
  write_file(
      file, props::to_json(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void write_all(const props::VerifyReport& r, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw UsageError(
        fmt::format("cannot create report directory '{}': {}", dir.string(), ec.message()));
  }
  write_markdown(r, dir / "report.md");
  write_html(r, dir / "report.html");
  write_json(r, dir / "results.json");
  write_junit(r, dir / "junit.xml");
}

}  // namespace zc::reports
