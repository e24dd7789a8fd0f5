// TreeModel: a random module tree for invariant I4 (SPEC 7), decoded from a code a RapidCheck
// generator can produce and shrink. code[i] describes the i-th node in preorder, the root first:
// v % 3 children; w = (v / 3) % 16 gives the node a param "weight" [w] when w > 0, and
// b = (v / 48) % 8 a param "bias" [2, b] when b > 0; u = (v / 384) % 8 > 0 makes the node also
// use an external param (Note [Tree external params]), and a = (v / 3072) % 8 > 0 gives it an
// alias "tied" of an earlier node's param (Note [Tree aliases]). Nodes past the end of the code
// are leaves without params; depth and node count are capped; a tree without params gets "weight" [1] on
// the root. The loss is linear in the params, L = (1/B) sum_s sum_p <g_{s,p}, p> (Synthetic's),
// so grads are prescribed and exact; each node's forward and backward runs inside its hooks, so
// ZeRO-3 gathers and releases node by node, and every param is read through ParamDict::get.
#pragma once

#include "engine/model.h"

namespace zc {

class TreeNode : public Module {
 public:
  explicit TreeNode(std::string name) : Module(std::move(name)) {}
  TreeNode(const TreeNode&) = default;
  std::string kind() const override { return "tree_node"; }

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<TreeNode>(*this); }
};

class TreeModel : public Model {
 public:
  static constexpr int kMaxDepth = 4;
  static constexpr int kMaxNodes = 24;

  explicit TreeModel(std::vector<std::int64_t> code, std::string name = "tree");
  TreeModel(const TreeModel&) = default;
  std::string kind() const override { return "tree"; }
  nlohmann::json kind_args() const override;
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  // "g{id}" [samples, numel of param id] for every param.
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  HostBatch batch_shapes(std::int64_t samples) const override;
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;
  int num_nodes() const { return nodes_; }

  // A node's use of a param another node owns; paths are module paths from this root ("" is the
  // root), so a copy of the tree resolves them in the copy.
  struct ExternalUse {
    std::string user, owner, local;
    bool registered = false;  // declared with Engine::register_external_parameter by the trainer
  };
  // What one read of an external param saw: its status before ParamDict::get and after, and the
  // device's live bytes around the get and after the user's forward.
  struct ExternalRead {
    std::string param, user;
    ZeroStatus status_before{}, status_read{};
    std::int64_t live_before = 0, live_read = 0;
    std::int64_t live_after = 0;  // after the using module's post-forward hooks
  };
  const std::vector<ExternalUse>& external_uses() const { return uses_; }
  // The uses marked `registered`, resolved in this tree: (using module, param) pairs for
  // Engine::register_external_parameter.
  std::vector<std::pair<Module*, Parameter*>> registered_external_uses();
  // The last forward's reads, in order.
  const std::vector<ExternalRead>& external_reads() const { return reads_; }
  // The last forward's reads of aliases through the aliasing module's own ParamDict, in order.
  const std::vector<ExternalRead>& alias_reads() const { return alias_reads_; }
  int num_aliases() const { return static_cast<int>(tied_.size()); }

 protected:
  std::unique_ptr<Module> clone_impl() const override { return std::make_unique<TreeModel>(*this); }

 private:
  void build(Module& node, std::size_t& next, int depth);
  void add_external_use(Module& node, std::int64_t u);
  void add_alias(Module& node, std::int64_t a);
  void read_aliases(Device& dev, Module& m);
  void check_tied_gathered(const Module& m, std::string_view when) const;
  Module& module_at(const std::string& path);
  void read_external(Device& dev, Module& m);
  double node_forward(Device& dev, Module& m);
  void node_backward(Device& dev, Module& m, double loss_scale, std::int64_t ga);

  std::vector<std::int64_t> code_;
  int nodes_ = 1;
  std::vector<std::int64_t> numels_;  // [param id] numel
  std::vector<ExternalUse> uses_;
  std::vector<std::pair<std::string, std::string>> built_;  // (owner path, local) in id order
  std::vector<ExternalRead> reads_;
  std::vector<ExternalRead> alias_reads_;
  std::vector<std::pair<std::string, std::string>> tied_;  // (owner path, local) of aliased params
  Batch held_;
  std::int64_t loss_readers_left_ = 0;  // backward's: the params whose node has not yet run
};

}  // namespace zc
