// results.json: the machine-readable form of a verify run (docs/verify.md documents every key).
#include "props/verify_report.h"

namespace zc::props {

bool VerifyReport::passed() const {
  if (!errors.empty()) return false;
  for (const InvariantResult& i : invariants) {
    if (!i.holds) return false;
  }
  for (const BugResult& b : bugs) {
    if (!b.caught) return false;
  }
  for (const ProofResult& p : proofs) {
    if (!p.ok()) return false;
  }
  if (!reference.is_null() && !reference.value("holds", false)) return false;
  return determinism.mismatches == 0;
}

nlohmann::json to_json(const VerifyReport& r) {
  nlohmann::json j;
  j["zerocheck"] = "verify";
  j["profile"] = r.profile;
  j["seed"] = r.seed;
  j["jobs"] = r.jobs;
  j["ranks"] = r.ranks;
  j["seconds"] = r.seconds;
  j["started"] = r.started;
  j["passed"] = r.passed();
  j["invariants"] = nlohmann::json::array();
  for (const InvariantResult& i : r.invariants) {
    j["invariants"].push_back({{"name", i.name}, {"explanation", i.explanation}, {"holds", i.holds},
                               {"cases", i.cases}, {"discarded", i.discarded}, {"seconds", i.seconds},
                               {"failure", i.failure}, {"counterexample", i.counterexample},
                               {"scenario_file", i.scenario_file}, {"reproduce", i.reproduce},
                               {"ds_config_file", i.ds_config_file}, {"not_applicable", i.not_applicable}});
  }
  if (!r.user_config.is_null()) j["user_config"] = r.user_config;
  j["known_bugs"] = nlohmann::json::array();
  for (const BugResult& b : r.bugs) {
    j["known_bugs"].push_back({{"id", b.id}, {"summary", b.summary}, {"expected_by", b.expected_by},
                               {"caught", b.caught}, {"by", b.by}, {"cases_to_catch", b.cases_to_catch},
                               {"seconds", b.seconds}, {"shrink_steps", b.shrink_steps},
                               {"failure", b.failure}, {"scenario", b.scenario},
                               {"scenario_file", b.scenario_file}, {"reproduce", b.reproduce}});
  }
  j["proofs"] = nlohmann::json::array();
  for (const ProofResult& p : r.proofs) {
    j["proofs"].push_back({{"name", p.name}, {"verdict", p.verdict}, {"expected", p.expected},
                           {"ok", p.ok()}, {"seconds", p.seconds}, {"detail", p.detail}});
  }
  j["determinism"] = {{"runs", r.determinism.runs}, {"mismatches", r.determinism.mismatches},
                      {"detail", r.determinism.detail}};
  j["errors"] = r.errors;
  if (!r.reference.is_null()) j["reference"] = r.reference;
  j["collectives_per_step"] = nlohmann::json::array();
  for (const CollectivePoint& c : r.collectives) {
    j["collectives_per_step"].push_back({{"stage", c.stage}, {"n_backward", c.n_backward},
                                         {"baseline", c.baseline}, {"coalesced", c.coalesced}});
  }
  return j;
}

VerifyReport report_from_json(const nlohmann::json& j) {
  VerifyReport r;
  r.profile = j.value("profile", "");
  r.seed = j.value("seed", std::uint64_t{0});
  r.jobs = j.value("jobs", 1);
  r.ranks = j.value("ranks", 1);
  r.seconds = j.value("seconds", 0.0);
  r.started = j.value("started", "");
  r.user_config = j.value("user_config", nlohmann::json());
  for (const auto& i : j.value("invariants", nlohmann::json::array())) {
    InvariantResult x;
    x.name = i.at("name");
    x.explanation = i.value("explanation", "");
    x.holds = i.at("holds");
    x.cases = i.at("cases");
    x.discarded = i.value("discarded", 0);
    x.seconds = i.at("seconds");
    x.failure = i.value("failure", "");
    x.counterexample = i.value("counterexample", nlohmann::json());
    x.ds_config_file = i.value("ds_config_file", "");
    x.not_applicable = i.value("not_applicable", "");
    x.scenario_file = i.value("scenario_file", "");
    x.reproduce = i.value("reproduce", "");
    r.invariants.push_back(std::move(x));
  }
  for (const auto& b : j.value("known_bugs", nlohmann::json::array())) {
    BugResult x;
    x.id = b.at("id");
    x.summary = b.value("summary", "");
    x.expected_by = b.value("expected_by", "");
    x.caught = b.at("caught");
    x.by = b.at("by");
    x.cases_to_catch = b.at("cases_to_catch");
    x.seconds = b.at("seconds");
    x.shrink_steps = b.value("shrink_steps", 0);
    x.failure = b.value("failure", "");
    x.scenario = b.value("scenario", nlohmann::json());
    x.scenario_file = b.at("scenario_file");
    x.reproduce = b.at("reproduce");
    r.bugs.push_back(std::move(x));
  }
  for (const auto& p : j.value("proofs", nlohmann::json::array())) {
    ProofResult x;
    x.name = p.at("name");
    x.verdict = p.at("verdict");
    x.expected = p.value("expected", x.verdict);
    x.seconds = p.at("seconds");
    x.detail = p.value("detail", "");
    r.proofs.push_back(std::move(x));
  }
  const nlohmann::json det = j.value("determinism", nlohmann::json::object());
  r.determinism.runs = det.value("runs", 0);
  r.determinism.mismatches = det.value("mismatches", 0);
  r.determinism.detail = det.value("detail", "");
  r.errors = j.value("errors", std::vector<std::string>{});
  if (j.contains("reference")) r.reference = j.at("reference");
  for (const auto& c : j.value("collectives_per_step", nlohmann::json::array())) {
    r.collectives.push_back({c.at("stage"), c.at("n_backward"), c.at("baseline"), c.at("coalesced")});
  }
  return r;
}

}  // namespace zc::props
