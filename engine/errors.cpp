// Out-of-line parts of the error hierarchy: the assertion failure path and the diagnostic rank.
#include "engine/errors.h"

namespace zc {

namespace {
thread_local int g_current_rank = -1;  // diagnostics only; never reaches a result
}

int current_rank() { return g_current_rank; }
void set_current_rank(int rank) { g_current_rank = rank; }

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("ZC_ASSERT({}) failed on rank {} at {}:{}{}{}", cond,
                                  current_rank(), file, line, msg.empty() ? "" : ": ", msg));
}

}  // namespace zc
