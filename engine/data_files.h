// Where zerocheck finds the data files it ships (plan/hardware.json, reference/deepspeed/...): beside
// an installed binary first (<prefix>/bin/zerocheck reads <prefix>/share/zerocheck/<relative>, the
// layout `cmake --install` writes), else in the source tree the binary was built from, so a build
// tree, an installed copy and a moved prefix each find their own files.
#pragma once

#include <filesystem>
#include <string_view>

namespace zc {

// The first of <dir of /proc/self/exe>/../share/zerocheck/<relative> and <source_dir>/<relative>
// that exists; the source tree's path when neither does (so an error names where it looked last).
std::filesystem::path data_file(std::string_view relative, std::string_view source_dir);

}  // namespace zc
