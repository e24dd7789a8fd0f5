// The lifecycle model. Each command predicts its outcome from the model state (before applying
// itself), runs on the engine, compares, then the runner compares the engine's counters and
// flags with the model's.
#include "props/state_machine.h"

#include "engine/errors.h"
#include "models/synthetic.h"
#include "sim/sim_cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck/state.h>

namespace zc::props {

namespace {

struct LifeModel {
  int stage = 0;
  bool destroyed = false;
  bool compiled = false;
  std::int64_t forwards = 0;          // forward() calls that ran
  bool fresh_loss = false;            // the last forward's loss has not been backwarded yet
  std::int64_t micro_steps = 0, global_steps = 0;
  std::optional<bool> boundary;       // set_gradient_accumulation_boundary (GA is 1)
  int backwards_since_step = 0;
  bool unreduced = false;             // the last backward ran inside no_sync (grads are local)
  bool last_backward_at_boundary = false;
  bool at_boundary() const { return boundary.value_or(true); }
};

// The rank's engine and what the commands need to drive it.
struct LifeSut {
  Engine& engine;
  Model& model;
  Device& dev;
  std::vector<Engine::Loss> losses;
  Rng rng;
  Engine::Loss forward() {
    const Batch b = upload_batch(dev, model.make_batch(rng, 2, DataDomain::exact, ExactSpec{1, 0, 2}), DType::f32);
    losses.push_back(engine.forward(b));
    return losses.back();
  }
};

// A predicted outcome: the error type and a phrase of its message, or none.
struct Expect {
  std::string kind, phrase;
};

std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const UsageError*>(&e)) return "UsageError";
  if (dynamic_cast<const NotImplementedError*>(&e)) return "NotImplementedError";
  if (dynamic_cast<const ConfigError*>(&e)) return "ConfigError";
  return "other";
}

const Expect kUnusable{"UsageError", "unusable"};

struct LifeCmd : rc::state::Command<LifeModel, LifeSut> {
  virtual std::string name() const = 0;
  virtual Expect expect(const LifeModel& m) const = 0;
  virtual void call(LifeSut& sut) const = 0;
  void show(std::ostream& os) const override { os << name(); }
  void run(const LifeModel& m, LifeSut& sut) const override {
    const Expect want = expect(m);
    std::string kind, what;
    try {
      call(sut);
    } catch (const std::exception& e) {
      kind = error_kind(e), what = e.what();
    }
    if (kind != want.kind || what.find(want.phrase) == std::string::npos) {
      throw std::runtime_error(fmt::format("'{}' should {} but {}", name(),
                                           want.kind.empty() ? "succeed" : fmt::format("raise {} mentioning '{}'", want.kind, want.phrase),
                                           kind.empty() ? "succeeded" : fmt::format("raised {}: {}", kind, what)));
    }
  }
};

struct Forward final : LifeCmd {
  std::string name() const override { return "forward"; }
  Expect expect(const LifeModel& m) const override { return m.destroyed ? kUnusable : Expect{}; }
  void call(LifeSut& sut) const override { sut.forward(); }
  void apply(LifeModel& m) const override {
    if (m.destroyed) return;
    ++m.forwards;
    m.fresh_loss = true;
  }
};

struct Backward final : LifeCmd {
  std::string name() const override { return "backward"; }
  void checkPreconditions(const LifeModel& m) const override { RC_PRE(m.fresh_loss || m.destroyed); }
  Expect expect(const LifeModel& m) const override { return m.destroyed ? kUnusable : Expect{}; }
  void call(LifeSut& sut) const override {
    if (sut.losses.empty()) throw UsageError("this engine is unusable (no forward ran)");
    sut.engine.backward(sut.losses.back());
  }
  void apply(LifeModel& m) const override {
    if (m.destroyed) return;
    m.fresh_loss = false;
    ++m.backwards_since_step;
    m.unreduced = false;
    m.last_backward_at_boundary = m.at_boundary();
  }
};

struct StaleBackward final : LifeCmd {
  std::string name() const override { return "stale-backward"; }
  void checkPreconditions(const LifeModel& m) const override { RC_PRE(m.forwards >= 2); }
  Expect expect(const LifeModel& m) const override {
    return m.destroyed ? kUnusable : Expect{"UsageError", "call forward() before each backward()"};
  }
  void call(LifeSut& sut) const override { sut.engine.backward(sut.losses.at(sut.losses.size() - 2)); }
  void apply(LifeModel&) const override {}
};

struct Boundary final : LifeCmd {
  bool value = true;
  Boundary() : value(*rc::gen::arbitrary<bool>()) {}
  explicit Boundary(bool v) : value(v) {}
  std::string name() const override { return value ? "boundary:true" : "boundary:false"; }
  Expect expect(const LifeModel&) const override { return {}; }
  void call(LifeSut& sut) const override { sut.engine.set_gradient_accumulation_boundary(value); }
  void apply(LifeModel& m) const override { m.boundary = value; }
};

struct Step final : LifeCmd {
  std::string name() const override { return "step"; }
  // A boundary step needs reduced gradients from a backward at the boundary (the usage
  // DeepSpeed supports); a non-boundary step only counts the micro-step.
  void checkPreconditions(const LifeModel& m) const override {
    RC_PRE(m.destroyed || !m.at_boundary() ||
           (m.backwards_since_step > 0 && m.last_backward_at_boundary && !m.unreduced));
  }
  Expect expect(const LifeModel& m) const override { return m.destroyed ? kUnusable : Expect{}; }
  void call(LifeSut& sut) const override { sut.engine.step(); }
  void apply(LifeModel& m) const override {
    if (m.destroyed) return;
    if (m.at_boundary()) {
      ++m.global_steps;
      m.backwards_since_step = 0;
    }
    ++m.micro_steps;
  }
};

struct ZeroGrad final : LifeCmd {
  std::string name() const override { return "zero_grad"; }
  // Dropping grads between a non-boundary backward and the boundary one is legal but loses
  // them; the model keeps to zero_grad right after a step, as training loops do.
  void checkPreconditions(const LifeModel& m) const override { RC_PRE(m.backwards_since_step == 0); }
  Expect expect(const LifeModel&) const override { return {}; }
  void call(LifeSut& sut) const override { sut.engine.zero_grad(); }
  void apply(LifeModel&) const override {}
};

struct NoSync final : LifeCmd {
  std::string name() const override { return "no_sync"; }
  void checkPreconditions(const LifeModel& m) const override { RC_PRE(!m.destroyed); }
  Expect expect(const LifeModel& m) const override {
    if (m.stage >= 2) return {"UsageError", "incompatible with gradient partitioning"};
    return {};
  }
  void call(LifeSut& sut) const override {
    sut.engine.no_sync([&] { sut.engine.backward(sut.forward()); });
  }
  void apply(LifeModel& m) const override {
    if (m.stage >= 2) return;
    ++m.forwards;
    m.fresh_loss = false;
    ++m.backwards_since_step;
    m.unreduced = true;
    m.last_backward_at_boundary = m.at_boundary();
  }
};

struct NestedNoSync final : LifeCmd {
  std::string name() const override { return "nested-no_sync"; }
  void checkPreconditions(const LifeModel& m) const override { RC_PRE(!m.destroyed); }
  Expect expect(const LifeModel& m) const override {
    if (m.stage >= 2) return {"UsageError", "incompatible with gradient partitioning"};
    return {"UsageError", "reentry is unsupported"};
  }
  void call(LifeSut& sut) const override {
    sut.engine.no_sync([&] { sut.engine.no_sync([] {}); });
  }
  void apply(LifeModel&) const override {}
};

struct Coalesce final : LifeCmd {
  int k = 1;
  Coalesce() : k(*rc::gen::inRange(1, 4)) {}
  explicit Coalesce(int n) : k(n) {}
  std::string name() const override { return fmt::format("coalesce:{}", k); }
  void checkPreconditions(const LifeModel& m) const override { RC_PRE(!m.destroyed); }
  Expect expect(const LifeModel& m) const override {
    if (m.stage == 0) return {"NotImplementedError", "requires ZeRO stage 1/2/3"};
    return {};
  }
  void call(LifeSut& sut) const override {
    sut.engine.coalesce_grad_reduction([&] {
      for (int i = 0; i < k; ++i) sut.engine.backward(sut.forward());
    });
  }
  void apply(LifeModel& m) const override {
    if (m.stage == 0) return;
    m.forwards += k;
    m.fresh_loss = false;
    m.backwards_since_step += k;
    m.unreduced = false;
    m.last_backward_at_boundary = true;  // the flush runs at the boundary
  }
};

const std::vector<std::string> kPasses = {"z1", "z3", "autosp", "autotp"};

struct Compile final : LifeCmd {
  int mask = 0;
  Compile() : mask(*rc::gen::inRange(0, 16)) {}
  explicit Compile(int m) : mask(m) {}
  std::vector<std::string> passes() const {
    std::vector<std::string> out;
    for (int b = 0; b < 4; ++b) {
      if (mask & (1 << b)) out.push_back(kPasses[static_cast<std::size_t>(b)]);
    }
    return out;
  }
  std::string name() const override { return fmt::format("compile:{}", mask); }
  // compile() comes before training, once.
  void checkPreconditions(const LifeModel& m) const override { RC_PRE(m.destroyed || (!m.compiled && m.forwards == 0)); }
  Expect expect(const LifeModel& m) const override {
    if (m.destroyed) return kUnusable;
    if ((mask & 8) && mask != 8) return {"NotImplementedError", "autotp pass cannot be combined"};
    return {};
  }
  void call(LifeSut& sut) const override { sut.engine.compile(CompileConfig{true, passes()}); }
  void apply(LifeModel& m) const override {
    if (!m.destroyed && !((mask & 8) && mask != 8)) m.compiled = true;
  }
};

struct Destroy final : LifeCmd {
  std::string name() const override { return "destroy"; }
  Expect expect(const LifeModel& m) const override { return m.destroyed ? kUnusable : Expect{}; }
  void call(LifeSut& sut) const override { sut.engine.destroy(); }
  void apply(LifeModel& m) const override { m.destroyed = true; }
};

using CmdPtr = std::shared_ptr<const LifeCmd>;

CmdPtr parse_command(const std::string& text) {
  const std::size_t colon = text.find(':');
  const std::string head = text.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (head == "forward") return std::make_shared<Forward>();
  if (head == "backward") return std::make_shared<Backward>();
  if (head == "stale-backward") return std::make_shared<StaleBackward>();
  if (head == "boundary") return std::make_shared<Boundary>(arg == "true");
  if (head == "step") return std::make_shared<Step>();
  if (head == "zero_grad") return std::make_shared<ZeroGrad>();
  if (head == "no_sync") return std::make_shared<NoSync>();
  if (head == "nested-no_sync") return std::make_shared<NestedNoSync>();
  if (head == "coalesce") return std::make_shared<Coalesce>(std::stoi(arg));
  if (head == "compile") return std::make_shared<Compile>(std::stoi(arg));
  if (head == "destroy") return std::make_shared<Destroy>();
  throw ConfigError(fmt::format("unknown lifecycle command '{}'", text));
}

}  // namespace

rc::Gen<Scenario> gen_lifecycle_scenario() {
  return rc::gen::mapcat(rc::gen::tuple(rc::gen::inRange(1, 3), rc::gen::inRange(0, 4),
                                        rc::gen::map(rc::gen::arbitrary<std::uint32_t>(), [](std::uint32_t v) { return std::uint64_t{v} + 1; })),
                         [](const std::tuple<int, int, std::uint64_t>& t) {
    LifeModel initial;
    initial.stage = std::get<1>(t);
    const auto cmds = rc::state::gen::commands(initial, rc::state::gen::execOneOfWithArgs<
        Forward, Forward, Forward, Backward, Backward, Backward, StaleBackward, Boundary, Boundary, Step, Step, Step,
        ZeroGrad, NoSync, NestedNoSync, Coalesce, Coalesce, Compile, Destroy>());
    return rc::gen::map(rc::gen::resize(30, cmds), [t](const auto& list) {
      Scenario s;
      s.world = std::get<0>(t);
      s.stage = std::get<1>(t);
      s.seed = s.sched_seed = std::get<2>(t);
      s.model = "synthetic";
      s.shape = {5, 3};
      s.steps = 1;
      for (const auto& c : list) s.commands.push_back(dynamic_cast<const LifeCmd&>(*c).name());
      return s;
    });
  });
}

Verdict check_lifecycle(const Scenario& s, const CheckContext& ctx) {
  if (s.commands.empty()) {
    Verdict v;
    v.applies = false;
    return v;
  }
  std::vector<CmdPtr> cmds;
  for (const std::string& c : s.commands) cmds.push_back(parse_command(c));
  Verdict v;
  try {
    const sim::SimResult r = sim::SimCluster(s.world, s.sched_seed).run([&](sim::RankContext& ctx_r) {
      nlohmann::json j = ds_config(s);
      j["train_micro_batch_size_per_gpu"] = 2;
      j["tensor_parallel"] = {{"autotp_size", 2}};
      const Config cfg = Config::from_json(j, s.world);
      Synthetic model(std::vector<Shape>{{5}, {3}});
      Rng init(s.seed);
      model.init_params(ctx_r.device, DType::f32, DataDomain::exact, ExactSpec{1, 0, 2}, init);
      std::unique_ptr<RuntimeLoader> loader = ctx.hooks.make_loader ? ctx.hooks.make_loader() : nullptr;
      Options opts;
      opts.bugs = ctx.bugs;
      opts.trace = &ctx_r.trace;
      opts.deepcompile_loader = loader.get();
      Engine engine(cfg, model, ctx_r.device, ctx_r.world, opts);
      LifeSut sut{engine, model, ctx_r.device, {}, Rng(s.seed).split(static_cast<std::uint64_t>(ctx_r.rank) + 100)};
      LifeModel m;
      m.stage = s.stage;
      for (std::size_t i = 0; i < cmds.size(); ++i) {
        const LifeCmd& c = *cmds[i];
        try {
          c.run(m, sut);
        } catch (const std::runtime_error& e) {
          throw std::runtime_error(fmt::format("command #{} {}", i, e.what()));
        }
        c.apply(m);
        const std::string state = fmt::format("micro_steps {} global_steps {} coalescing {} inside_no_sync {}",
                                              engine.micro_steps(), engine.global_steps(), engine.coalescing(),
                                              engine.inside_no_sync());
        const std::string want = fmt::format("micro_steps {} global_steps {} coalescing false inside_no_sync false",
                                             m.micro_steps, m.global_steps);
        if (state != want) throw std::runtime_error(fmt::format("after command #{} '{}': engine has {}, model predicts {}", i, c.name(), state, want));
      }
    });
    v.trace_hash = r.trace_hash;
  } catch (const ZcError& e) {  // the simulator's error, stamped with the failed run's trace hash
    v.holds = false;
    v.failure = e.what();
    v.trace_hash = e.trace_hash();
  }
  return v;
}

}  // namespace zc::props
