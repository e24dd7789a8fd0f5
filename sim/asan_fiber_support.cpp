// Sanitizer builds only (preset `asan`): Boost.Context's ucontext fibers carry the AddressSanitizer
// stack-switch annotations, but Debian's libboost_context is built for fcontext and lacks the
// ucontext back end's one out-of-line symbol: the thread's current activation record. It is
// defined here, with the main context's record created on first use.
#if defined(BOOST_USE_UCONTEXT)

#include <boost/context/fiber.hpp>

namespace boost::context::detail {

namespace {
thread_local fiber_activation_record* g_current_record = nullptr;

struct MainRecord {
  MainRecord() noexcept { g_current_record = new fiber_activation_record(); }
  ~MainRecord() { delete g_current_record; }
};
}  // namespace

fiber_activation_record*& fiber_activation_record::current() noexcept {
  thread_local MainRecord main_record;
  return g_current_record;
}

}  // namespace boost::context::detail

#endif
