// The release bisect (Note [Release bisect]) over scripted histories: no DeepSpeed runs here, the
// verdict of each release is a table, so each test states the answer the bisection must find and
// how many releases it may run.
#include "props/deepspeed_seeds.h"
#include "props/deepspeed_target.h"

#include "engine/errors.h"

#include <gtest/gtest.h>

#include <map>

namespace zc::props {
namespace {

using V = SeedVerdict;

std::vector<std::string> releases(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(fmt::format("0.{}.0", 14 + i));
  return out;
}

struct Scripted {
  std::map<std::string, V> table;
  int runs = 0;
  SeedResult operator()(const std::string& r) {
    ++runs;
    SeedResult s;
    s.verdict = table.at(r);
    return s;
  }
};

Scripted history(const std::vector<std::string>& rs, const std::vector<V>& vs) {
  Scripted s;
  for (std::size_t i = 0; i < rs.size(); ++i) s.table[rs[i]] = vs[i];
  return s;
}

TEST(ReleaseBisect, FindsTheBoundaryWithFewRuns) {
  const auto rs = releases(32);
  std::vector<V> vs(32, V::holds);
  for (int i = 0; i < 8; ++i) vs[static_cast<std::size_t>(i)] = V::not_applicable;
  for (int i = 8; i < 21; ++i) vs[static_cast<std::size_t>(i)] = V::fails;
  Scripted s = history(rs, vs);
  const Bisection b = bisect_releases("X", rs, std::ref(s));
  ASSERT_TRUE(b.first_good && b.last_bad);
  EXPECT_EQ(*b.last_bad, rs[20]);
  EXPECT_EQ(*b.first_good, rs[21]);
  EXPECT_TRUE(b.monotone) << b.note;
  EXPECT_LE(s.runs, 9);  // log2(32) + the neighbours, not 32
}

TEST(ReleaseBisect, StepsOverReleasesThatDoNotRun) {
  const auto rs = releases(10);
  std::vector<V> vs = {V::fails, V::fails, V::fails, V::not_runnable, V::not_runnable, V::not_runnable,
                       V::holds, V::holds, V::holds, V::holds};
  Scripted s = history(rs, vs);
  const Bisection b = bisect_releases("X", rs, std::ref(s));
  ASSERT_TRUE(b.first_good && b.last_bad);
  EXPECT_EQ(*b.first_good, rs[6]);
  EXPECT_EQ(*b.last_bad, rs[2]);  // the nearest runnable release below the boundary
  EXPECT_EQ(b.verdicts.at(rs[3]).verdict, V::not_runnable);
}

TEST(ReleaseBisect, SaysWhenTheHistoryIsNotMonotone) {
  // I4's real shape: fails, holds, fails again (a regression), holds.
  const auto rs = releases(8);
  std::vector<V> vs = {V::fails, V::fails, V::holds, V::holds, V::fails, V::fails, V::holds, V::holds};
  Scripted s = history(rs, vs);
  const Bisection b = bisect_releases("X", rs, std::ref(s));
  ASSERT_TRUE(b.first_good);
  // Whatever boundary it lands on, an evaluated contradiction is reported, or the boundary found is
  // the last one (the regression's fix) with its failing neighbour.
  if (b.monotone) {
    EXPECT_EQ(*b.first_good, rs[6]);
    EXPECT_EQ(*b.last_bad, rs[5]);
  } else {
    EXPECT_NE(b.note.find("after a release where it holds"), std::string::npos) << b.note;
  }
}

TEST(ReleaseBisect, EveryReleaseSeesASecondBoundary) {
  const auto rs = releases(8);
  std::vector<V> vs = {V::fails, V::fails, V::holds, V::holds, V::fails, V::fails, V::holds, V::holds};
  Scripted s = history(rs, vs);
  const Bisection b = bisect_releases("X", rs, std::ref(s), /*every_release=*/true);
  EXPECT_EQ(s.runs, 8);
  EXPECT_FALSE(b.monotone);
  EXPECT_NE(b.note.find("0.18.0 fails after a release where it holds"), std::string::npos) << b.note;
}

TEST(ReleaseBisect, NothingHoldsOrNothingApplies) {
  const auto rs = releases(5);
  Scripted fails = history(rs, std::vector<V>(5, V::fails));
  const Bisection b = bisect_releases("X", rs, std::ref(fails));
  EXPECT_FALSE(b.first_good);
  ASSERT_TRUE(b.last_bad);
  EXPECT_EQ(*b.last_bad, rs[4]);
  Scripted na = history(rs, {V::not_applicable, V::not_applicable, V::holds, V::holds, V::holds});
  const Bisection c = bisect_releases("X", rs, std::ref(na));
  ASSERT_TRUE(c.first_good);
  EXPECT_EQ(*c.first_good, rs[2]);
  EXPECT_FALSE(c.last_bad);
  EXPECT_NE(c.note.find("holds in every release where it applies"), std::string::npos);
}

TEST(DeepSpeedTarget, FormsAndErrors) {
  EXPECT_TRUE(is_pinned("deepspeed"));
  EXPECT_FALSE(is_pinned("deepspeed==0.15.4"));
  EXPECT_EQ(normalize_target("deepspeed@/a/b/../c"), "deepspeed@/a/c");
  EXPECT_THROW(normalize_target("deepspeed==0.15"), UsageError);
  EXPECT_THROW(normalize_target("deepspeed=0.15.4"), UsageError);
  EXPECT_THROW(normalize_target("torch"), UsageError);
  EXPECT_TRUE(version_less("0.9.5", "0.15.0"));
  EXPECT_FALSE(version_less("0.15.10", "0.15.9"));
  EXPECT_EQ(find_seed_invariant("i4").name, "I4-copies-keep-parent");
  EXPECT_THROW(find_seed_invariant("I9"), ConfigError);
}

}  // namespace
}  // namespace zc::props
