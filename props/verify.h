// The verify job: every invariant over generated scenarios on the correct engine, then every
// known bug switched on against the suite (caught, shrunk, saved, replayed), the Z3 proofs, the
// determinism self-check and the collective counts for the report. Work items run in forked
// child processes (--jobs at a time), so a crash in one is rerun, then reported, never fatal;
// under mpirun the items spread over the ranks (cli/verify_mpi.h), and a journal lets a killed
// run resume.
#pragma once

#include "props/invariants.h"
#include "props/user_config.h"
#include "props/verify_report.h"

#include <deque>
#include <filesystem>
#include <functional>
#include <optional>

namespace zc::props {

struct Profile {
  std::string name;
  int cases = 300;        // scenarios per invariant on the correct engine
  int bug_cases = 300;    // scenarios per invariant while hunting one known bug
  unsigned proof_timeout_ms = 240000;  // per proof; the f32 exact-domain lemma takes 30-50 s on 2 cores
};
// quick | default | thorough; ConfigError for anything else.
Profile profile_named(const std::string& name);

// Test-only fault injection for the runner's recovery paths (the CLI reads it from ZC_VERIFY_*
// variables): a work item that crashes its child, and an MPI rank that dies mid-job.
struct VerifyFaults {
  std::string crash_item;  // the named item's child raises SIGSEGV ...
  int crash_times = 0;     // ... on its first crash_times attempts
  int die_rank = -1;       // this MPI rank raises SIGKILL ...
  int die_after = 0;       // ... once it has finished this many items
  std::string hang_item;   // the named item's child sleeps forever (the item timeout must end it)
};

struct VerifyOptions {
  Profile profile = profile_named("default");
  std::uint64_t seed = 20261129;
  std::filesystem::path out = "reports/out";
  int jobs = 1;
  std::vector<std::string> only;  // invariant names (and bug campaigns through them); empty = all
  std::vector<std::string> bugs;  // known bugs to hunt ("B3"); empty = all
  bool proofs = true;
  bool engine_items = true;       // the invariants, bug hunts and collective counts (false: --only deepspeed)
  int deepspeed_cases = 0;        // > 0: also run the DeepSpeed reference campaigns (--against deepspeed)
  std::string deepspeed = "deepspeed";  // which DeepSpeed (props/deepspeed_target.h)
  std::string deepspeed_i3 = "all";  // ReferenceOptions::i3
  bool resume = false;            // take finished items from out/journal.jsonl, run only the rest
  double item_timeout_s = 7200;   // a work item's child still running after this is killed (a failed item)
  RunHooks hooks;
  // verify --config: the invariants around this config only (props/user_config.h); no bug hunt,
  // hazard, proof or collective count unless --bugs names some.
  std::optional<UserConfig> user_config;
  VerifyFaults faults;
  std::string started;  // the wall-clock start for the report (the caller's clock; ISO 8601 UTC)
  // Called as work items finish: (finished item, done, total).
  std::function<void(const std::string&, int, int)> progress;
};

// --only's names, expanded: a full invariant name, or a short id (I1 .. I4, any case) for every
// invariant of that id; ConfigError naming the known ones for anything else.
std::vector<std::string> expand_invariant_names(const std::vector<std::string>& names);

// The work items of one verify run (Note [Work items]): every invariant's campaign in ranges of
// cases, each bug hunt, each proof, the collective counts, the DeepSpeed campaigns. The list
// depends on the options alone, never on how many processes or ranks run it, so any split of it
// gives the same report. merge() turns the items' results (JSON, in item order) into the report
// and writes the counterexample files under opts.out.
class VerifyJob {
 public:
  explicit VerifyJob(const VerifyOptions& opts);  // ConfigError on an unknown invariant or bug
  VerifyJob(const VerifyJob&) = delete;  // the items capture `this`
  VerifyJob& operator=(const VerifyJob&) = delete;
  std::size_t size() const { return items_.size(); }
  const std::string& name(std::size_t i) const { return items_.at(i).name; }
  // Runs item i (in a child process); `attempt` counts from 1 (a rerun after a crash is 2).
  nlohmann::json run(std::size_t i, int attempt) const;
  // Over the options and the item names: two ranks, or a run and its journal, must agree on it.
  std::uint64_t fingerprint() const;
  std::string describe() const;  // "profile quick, seed 5, 31 items" for messages
  VerifyReport merge(const std::vector<nlohmann::json>& results, double seconds, int ranks) const;

 private:
  // What an item is, so that merge() never parses its name (the name is for the journal and
  // progress lines): its kind and the invariant, bug or proof it belongs to.
  enum class Kind : std::uint8_t { proof, bug, invariant, collectives, deepspeed };
  struct Item {
    std::string name;
    std::function<nlohmann::json()> run;
    Kind kind;
    std::string key;  // the proof's name, the bug's code, the invariant's name; "" otherwise
  };
  VerifyOptions opts_;
  std::vector<const Invariant*> invs_;
  std::deque<Invariant> pinned_;  // verify --config: invs_ point here
  std::vector<std::pair<std::string, std::string>> not_applicable_;  // verify --config: name, why
  std::vector<Item> items_;
};

VerifyReport run_verify(const VerifyOptions& opts);

// Case i of a campaign is generated from (seed, i) alone (Note [Indexed cases]), so a campaign
// splits into ranges run anywhere, and the lowest failing index is the one-process answer.
struct CaseRange {
  int first = 0;
  int last = 0;   // exclusive
  int total = 0;  // the whole campaign's cases: it sets each case's size
};

// What a soak run watches besides the verdicts: every k-th case is checked twice and must give
// the same verdict and trace hash; each checked case is reported with its time.
struct CaseWatch {
  int rerun_every = 0;  // 0: no reruns
  std::function<void(int index, const Scenario&, const Verdict&, double seconds)> on_case;
  // Count, do not stop (Note [Counting campaigns]): when set, a failing case does not end the
  // campaign. It is handed to this function, which says whether to shrink it (the first of its
  // class); a shrunk failure is kept in Campaign::shrunk and the campaign goes on.
  std::function<bool(int index, const Scenario&, const Verdict&)> on_failure;
};

// One failure of a counting campaign, shrunk.
struct ShrunkFailure {
  int index = -1;           // the case index that failed
  Scenario counterexample;  // shrunk
  Verdict verdict;          // of the shrunk counterexample
  std::string reproduce;
  int shrink_steps = 0;
};

// One RapidCheck campaign of an invariant: `cases` scenarios, or until one fails; the failure is
// shrunk. With `reproduce` (RapidCheck's reproduce string) it reruns exactly that case.
struct Campaign {
  bool failed = false;
  int first_failing = -1;  // the case index that failed (before shrinking)
  int cases = 0;       // scenarios run before the first failure (it included), or all
  int discarded = 0;
  double seconds = 0;
  int shrink_steps = 0;
  Scenario counterexample;  // shrunk
  Verdict verdict;          // of the shrunk counterexample
  std::string reproduce;
  std::string error;        // RapidCheck gave up or errored
  int failing_cases = 0;   // with CaseWatch::on_failure: every failing case (else 0 or 1)
  std::vector<ShrunkFailure> shrunk;  // with CaseWatch::on_failure: the ones it asked to shrink
  int reruns = 0;           // CaseWatch::rerun_every reruns, and how many disagreed
  int rerun_mismatches = 0;
  std::string rerun_detail;
};
Campaign run_campaign(const Invariant& inv, const CheckContext& ctx, int cases, std::uint64_t seed,
                      const std::string& reproduce = "");
// Cases [range.first, range.last) only, until the first failure, which is shrunk; with
// watch.on_failure, all of them.
Campaign run_campaign_range(const Invariant& inv, const CheckContext& ctx, CaseRange range,
                            std::uint64_t seed, const CaseWatch& watch = {});

// A saved counterexample: the scenario, the invariant, the bugs switched on, the verdict and
// trace hash it gave, and RapidCheck's reproduce string.
struct SavedCase {
  Scenario scenario;
  std::string invariant;
  BugSet bugs;
  bool holds = false;
  std::uint64_t trace_hash = 0;
  std::string failure;
  std::string reproduce;
  std::uint64_t rc_seed = 0;
};
nlohmann::json to_json(const SavedCase& c);
SavedCase saved_case_from_json(const nlohmann::json& j);
void save_case(const SavedCase& c, const std::filesystem::path& file);
SavedCase load_case(const std::filesystem::path& file);

}  // namespace zc::props
