// data_file (engine/data_files.h).
#include "engine/data_files.h"

#include <system_error>

namespace zc {

std::filesystem::path data_file(std::string_view relative, std::string_view source_dir) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed = exe.parent_path().parent_path() / "share" / "zerocheck" / relative;
    if (std::filesystem::exists(installed, ec)) return installed;
  }
  return std::filesystem::path(source_dir) / relative;
}

}  // namespace zc
