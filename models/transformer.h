// Transformer: the decoder-only family of real models, with explicit backward, at any size: GPT-2
// (learned positions, LayerNorm with bias, biased linears, GELU, tied embeddings) and Llama-2
// (rotary positions without a table, RMSNorm, SwiGLU, grouped-query attention from 70B on). The
// presets' parameter counts equal the published ones (transformer_preset; a test checks each).
// Module tree, as Hugging Face's: embed (tok [V,d], pos [P,d] when learned), layers.0..L-1, norm,
// lm_head (an alias of embed.tok when tied, Note [Shared params]) -- so ZeRO-3 gathers one module's
// params at a time. Token layout [N = B*S, width]; attention runs per (batch, head) on the head
// layout [B, heads, S, dh], query head h reading kv head h / (heads / kv_heads).
//
// Note [Attention memory]
// materialised (default, Hugging Face's eager attention): the probabilities [B*H*S, S] of every
// layer are kept for the backward, and the scores are a transient of the same size.
// fused (what FlashAttention-style kernels save): nothing of size S^2 is kept; forward and backward
// compute each (batch, head)'s [S, S] scores and probabilities one head at a time and free them,
// the backward recomputing them (so its attention FLOPs include a second forward's).
// Without checkpointing every layer keeps its activations until its backward, which frees them
// (as autograd frees saved tensors); with it, Note [Gradient checkpointing].
//
// Note [Gradient checkpointing]
// TransformerSpec::gradient_checkpointing is Hugging Face's gradient_checkpointing_enable() (the
// Trainer's --gradient_checkpointing): every decoder layer runs under torch.utils.checkpoint with
// use_reentrant=True, the default transformers 4.x passes (modeling_utils.py
// gradient_checkpointing_enable; torch/utils/checkpoint.py CheckpointFunction; 5.x passes False). The forward runs
// each layer without grad, so the layer frees each intermediate once its last forward use is past
// and keeps only its input (ctx.save_for_backward); the backward, when it reaches the layer,
// recomputes the layer's forward with grad (its ZeRO-3 pre- and post-forward hooks fire again,
// as DeepSpeed's do under the recomputation) and runs the layer's backward through what the
// recomputation saved, holding the saved input and the recomputed output until that backward
// ends. Embedding, final norm, LM head and loss are not checkpointed, as in Hugging Face. The
// gradients are the same bits (the recomputation is deterministic; a test checks it). Measured on
// CPU against transformers 5.25.0 (reference/hf/checkpoint_memory.py; the figures in
// reference/hf/measured/): four figures (after the forward, the forward's peak, the peak, after
// the backward) equal to the byte once torch's CPU RNG state each checkpoint keeps (5,056 B per
// layer, host memory on a GPU run) and two other listed terms are counted (test
// TransformerHfCpu). Not modelled: use_reentrant=False,
// transformers 5's default (recomputation on first unpack, each tensor freed as unpacked: 1.8 %
// below reentrant's peak there).
// CheckpointFunction::deepspeed runs the layers under deepspeed.checkpointing.checkpoint instead,
// configured by the ds_config's activation_checkpointing block (what Megatron-style models call;
// runtime/activation_checkpointing/checkpointing.py CheckpointFunction, 0.19.8). It recomputes as
// torch's does and drops its stash (ctx.deepspeed_saved_tensors) once the layer's backward has
// run; what it keeps differs with the settings, without a model-parallel group (mpu None):
//   - partition_activations: a clone of the input (the whole of it: one partition), the input's
//     own storage released when the layer's forward returns (arg.data replaced), and for every
//     tensor argument its size as an int64 tensor (torch.tensor(arg.size()),
//     get_partitioned_activations_for_backward), a CPU tensor (host memory on a GPU), kept until
//     the layer's backward. A floating-point
//     argument the layers share (a float mask, cos/sin) must be marked no_checkpointing, or
//     DeepSpeed empties it after the first layer (checkpointing.py:455; the twin marks them);
//   - contiguous_memory_optimization (with partition): at the first checkpointed layer,
//     number_checkpoints buffers of the input's size at once, on the device or, with
//     cpu_checkpointing, on the host; the clones are copied in; the list is dropped at the first
//     backward (unused buffers go then, used ones with their layer's backward);
//   - cpu_checkpointing: the kept input in host memory (on the host device), the device's copy
//     released; the backward copies it back to the device first (t.saved_data.to(device)), and
//     the host copy goes then. The copies' PCIe time is not in the step time.
// A number_checkpoints below the layers is refused (DeepSpeed's buffer index runs out), and so is
// a second forward that runs past the buffers without a backward between. The layers' other
// arguments (mask, position ids, cos/sin) are taken to be positional, as
// deepspeed.checkpointing.checkpoint(function, *args) takes them, and go after layer 0's backward;
// a floating-point mask would also be cloned per layer under partition_activations (not
// modelled: Megatron's is boolean, which DeepSpeed does not checkpoint). Without grad an MoE
// layer's experts free their intermediates expert by expert.
//
// Note [Hugging Face's saved tensors]
// The blocks compute op by op as Hugging Face's eager GPT2Block and LlamaDecoderLayer do, so that
// what a block keeps for its backward is what autograd keeps there (measured with
// saved_tensors_hooks: reference/deepspeed/gpu_saved_tensors.py, kept in
// reference/deepspeed/measured/h200-saved-tensors-*.json; docs/plan.md):
// - LayerNorm keeps its input, mean and rstd; RMSNorm keeps its input cast to f32, rstd, and the
//   normalised rows cast back to the model dtype (the weight's gradient reads them). Statistics
//   are f32 (f64 in f64 models), as torch's.
// - Llama's attention takes its softmax in f32 (softmax(dtype=float32)) and keeps it and its cast
//   to the model dtype (P V reads the cast); grouped-query K and V are repeated to every query head
//   and kept so (repeat_kv). GPT-2's softmax is in the model dtype.
// - GPT-2's gelu_new runs as its seven ops: it keeps the pre-activation x, tanh(c (x + a x^3)),
//   1 + tanh, 0.5 x and their product. Llama's MLP, and each Mixtral expert's, keeps gate,
//   silu(gate), up and their product.
// - The loss upcasts the logits to f32, keeps their log-softmax, and takes nll_loss's mean; its
//   backward holds nll_loss's gradient, log_softmax's and the kept log-softmax at once, as autograd
//   does (Device::log_softmax_nll, nll_loss_backward, log_softmax_backward). ForCausalLMLoss pads
//   the labels ([B, S + 1] int64, until the loss is taken) and keeps their shifted copy ([B, S]
//   int64) as nll_loss's target.
// - Beside the layers, the model's forward holds the eager causal mask [B, 1, S, S] in the model
//   dtype (materialised attention only) until it returns, and Llama's position ids (int64 [1, S])
//   and rotary cos and sin ([1, S, dh] each, model dtype), which the rope's products keep until
//   layer 0's backward. Under torch's checkpoint what Hugging Face passes a layer by keyword
//   (Llama's mask, ids and cos/sin; GPT-2's position ids) stays in every checkpoint's
//   run_function until the loss graph goes (after the step, at the next forward); what it passes
//   positionally (GPT-2's mask) is a saved input, gone after layer 0's backward (Note [Gradient
//   checkpointing]).
// On a GPU torch also holds a cuBLAS workspace per thread that runs matmuls, the forward's and
// autograd's (plan/plan.cpp torch_cublas_workspace_bytes): TransformerSpec::blas_workspace_bytes.
// What is not Hugging Face's yet (values; memory is the same): RMSNorm's output is rounded once
// ((x * rstd) * w, Hugging Face rounds x * rstd first), and its dx comes from rmsnorm_backward in
// one pass. The values are not compared with Hugging Face's yet (issue 41's transformer twin).
//
// Note [MoE routing]
// experts > 0 (Mixtral-style): every block's MLP is a router [experts, dim] (a Linear without
// bias, in the model dtype) and `experts` SwiGLU experts of width ffn, with top-2 routing as
// DeepSpeed's MoE layer does it (deepspeed/moe/sharded_moe.py, top2gating): softmax of the router
// logits, the two largest probabilities per token, DeepSpeed's capacity per expert
// max(ceil(f32(N / E) * f32(capacity_factor * 2)), min_capacity) over the N local tokens, first
// choices placed before second ones, choices past capacity dropped, and the kept probabilities
// renormalised (Device::moe_gate). Tokens travel to the experts' ranks by all_to_all over the
// expert-parallel group in DeepSpeed's [E, C, d] layout, and back; the output is the weighted sum
// of a token's kept choices. Experts are spread over the expert-parallel group (experts / ep_size
// each, global ids ep_rank * local + i) and marked is_expert, so the engine reduces them over
// the expert-data-parallel group. Not modelled: DeepSpeed's default Gumbel noise on the second
// choice (top2_2nd_expert_sampling: the second choice here is the second-largest probability),
// the load-balancing loss l_aux (DeepSpeed returns it for the user to add), drop_tokens=False,
// and top-1 / top-k > 2 gating (random token selection, drop_policy "probs").
#pragma once

#include "engine/comm.h"
#include "engine/model.h"

#include <string>
#include <vector>

namespace zc {

enum class NormKind : std::uint8_t { rmsnorm, layernorm };
enum class MlpKind : std::uint8_t { gelu, swiglu };
enum class PositionKind : std::uint8_t { learned, rotary };
enum class AttentionMemory : std::uint8_t { materialised, fused };
// What a checkpointed layer runs under (Note [Gradient checkpointing]).
enum class CheckpointFunction : std::uint8_t { torch_reentrant, deepspeed };

struct TransformerSpec {
  std::string preset;  // the preset's name ("" for a custom shape)
  std::int64_t vocab = 32;
  std::int64_t dim = 16;
  int layers = 2;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 4;   // grouped-query attention when < heads
  std::int64_t ffn = 32;       // MLP hidden width
  std::int64_t positions = 0;  // learned position table rows (GPT-2's n_positions)
  std::int64_t seq = 8;        // training sequence length (<= positions when learned)
  NormKind norm = NormKind::rmsnorm;
  MlpKind mlp = MlpKind::swiglu;
  PositionKind pos = PositionKind::rotary;
  bool tied_embeddings = false;
  bool bias = false;  // biases on the attention and MLP linears (GPT-2)
  double eps = 1e-5;
  double rope_base = 10000.0;
  AttentionMemory attention = AttentionMemory::materialised;
  bool gradient_checkpointing = false;  // Note [Gradient checkpointing]
  CheckpointFunction checkpoint_function = CheckpointFunction::torch_reentrant;
  // deepspeed.checkpointing's settings (the ds_config's activation_checkpointing block), with
  // CheckpointFunction::deepspeed; no model-parallel group (mpu None): a partition is the whole.
  bool ds_partition_activations = false, ds_contiguous_memory_optimization = false, ds_cpu_checkpointing = false;
  std::int64_t ds_number_checkpoints = 0;
  // Mixture of experts (Note [MoE routing]): 0 = a dense SwiGLU MLP.
  int experts = 0;
  int top_k = 2;
  double capacity_factor = 1.0;  // DeepSpeed MoE's default
  std::int64_t min_capacity = 4;  // DeepSpeed MoE's default
  // torch's cuBLAS workspace on a GPU (plan sets it from the GPU; 0 elsewhere): the forward and
  // the backward each take one at their first matmul and hold it (Note [Hugging Face's saved
  // tensors]). Not part of the shape's JSON.
  std::int64_t blas_workspace_bytes = 0;

  std::int64_t head_dim() const { return dim / heads; }
  // The number of parameters, from the shapes (tied embeddings counted once).
  std::int64_t param_count() const;
  // Slots per expert for n local tokens (Note [MoE routing]).
  std::int64_t capacity(std::int64_t tokens) const;
  // The largest single parameter (DeepSpeed's estimate_zero3 "largest_layer_params").
  std::int64_t largest_param() const;
  // "" when the shape is consistent, else what is wrong (names the field).
  std::string invalid() const;
  // ", gradient checkpointing", ", deepspeed.checkpointing[, its settings]" or "" (for summaries).
  std::string checkpointing_summary() const;
};

// Preset names: gpt2-xl, llama-2-7b, llama-2-13b, llama-2-70b, mixtral-8x7b, and the small test
// shapes gpt2-tiny, llama-tiny, llama-gqa-tiny, mixtral-tiny. ConfigError naming the known ones for any other name.
TransformerSpec transformer_preset(const std::string& name);
std::vector<std::string> transformer_presets();
// A custom shape from JSON: {"vocab":..,"dim":..,"layers":..,"heads":..,"kv_heads":..,"ffn":..,
// "seq":..,"norm":"rmsnorm|layernorm","mlp":"swiglu|gelu","positions":"rotary|learned",
// "max_positions":..,"tied_embeddings":..,"bias":..,"experts":..,"top_k":2,"capacity_factor":..,
// "min_capacity":..} (strict: unknown keys are a ConfigError).
// A Hugging Face config.json (it has "model_type") is read by transformer_spec_from_hf_config.
TransformerSpec transformer_spec_from_json(const nlohmann::json& j,
                                           std::vector<std::string>* notes = nullptr);
// A Hugging Face config.json of model_type llama, mistral, mixtral or gpt2, as its modeling code
// builds the model (defaults as the config classes'). Features that change shapes or memory and
// are not modelled are a ConfigError naming the key; those that change only values, or that the
// plan does not count, are said in `notes`. seq is max_position_embeddings (GPT-2: n_positions)
// until --seq sets the training length.
TransformerSpec transformer_spec_from_hf_config(const nlohmann::json& j,
                                                std::vector<std::string>& notes);

class Transformer : public Model {
 public:
  // ep: the expert-parallel group an MoE model's experts are spread over (null: every expert on
  // this rank, no all_to_all).
  explicit Transformer(TransformerSpec spec, std::string name = "transformer", Comm* ep = nullptr);
  Transformer(const Transformer&) = default;
  std::string kind() const override { return "transformer"; }
  nlohmann::json kind_args() const override;
  void init_params(Device& dev, DType dtype, DataDomain domain, const ExactSpec& ex,
                   Rng& rng) override;
  // "ids" and "labels" [samples, seq]: uniform random tokens, labels the next token.
  HostBatch make_batch(Rng& rng, std::int64_t samples, DataDomain domain,
                       const ExactSpec& ex) const override;
  HostBatch batch_shapes(std::int64_t samples) const override;
  double forward(Device& dev, const Batch& batch) override;
  void backward(Device& dev, double loss_scale, std::int64_t ga) override;
  std::string describe() const override;
  // Hugging Face's loss is taken on the logits upcast to f32 (Note [Hugging Face's saved tensors]).
  DType loss_dtype() const override { return stats_dtype(); }
  const TransformerSpec& spec() const { return spec_; }

 protected:
  std::unique_ptr<Module> clone_impl() const override {
    return std::make_unique<Transformer>(*this);
  }

 private:
  struct NormActs {  // what a norm keeps (Note [Hugging Face's saved tensors])
    Tensor x;          // [N,d] LayerNorm: its input; RMSNorm: its input in f32 (the input in f32/f64)
    Tensor mean, rstd; // [N] in stats_dtype(); mean for LayerNorm only
    Tensor xn;         // [N,d] RMSNorm: x * rstd in the model dtype
  };
  struct BlockActs {  // what a block's forward keeps for its backward; N tokens
    NormActs n1, n2;             // the attention's and the MLP's norms
    Tensor h1;                   // [N,d] attn norm out
    Tensor qh, kh, vh;           // [B,H,S,dh] (after rope); K, V [B,Hkv,S,dh], or [B,H,S,dh] when
                                 // materialised attention repeats them (repeat_kv)
    Tensor p32, p;               // [B*H*S, S] probabilities (materialised attention only): p32 the
                                 // f32 softmax (Llama in 16 bits), p in the model dtype
    Tensor o;                    // [N, H*dh] attention output (Wo's input)
    Tensor h2;                   // [N,d] mlp norm out
    // [N,ffn]. gelu: u pre-activation, th = tanh(c (u + a u^3)), th1 = 1 + th, xh = 0.5 u;
    // swiglu: g gate, s = silu(g), u up; a the MLP's output activation (the product).
    Tensor u, g, s, th, th1, xh, a;
    // MoE (Note [MoE routing]): router probs [N,E], weights and expert ids [N,k]; per slot of the
    // [E*C] layout its token and choice (n*k + j) or -1, and its weight; the experts' outputs
    // back in slot layout [E*C, d]; per local expert its input [ep*C, d] and gate, silu(gate),
    // up, act.
    Tensor probs, weights, index, slot_token, slot_choice, slot_w, y_slots;
    std::vector<Tensor> ein, eg, es, eu, ea;
  };
  Module& embed() const { return *children().front(); }
  Module& layer(std::size_t l) const { return *children().at(1 + l); }
  Module& final_norm() const { return *children().at(children().size() - 2); }
  Module& lm_head() const { return *children().back(); }

  // f32, or f64 in f64 models: norms' statistics and the loss.
  DType stats_dtype() const { return dtype_ == DType::f64 ? DType::f64 : DType::f32; }
  Tensor norm_forward(Device& dev, Module& m, const char* w, const Tensor& x, NormActs& s);
  Tensor norm_backward(Device& dev, Module& m, const char* w, Tensor dout, NormActs& s);
  // The divisor of a query head's index that gives its K/V head in a.kh and a.vh (1 once repeated).
  std::int64_t kv_div(const BlockActs& a) const;
  bool f32_softmax() const;
  Tensor repeat_kv(Device& dev, const Tensor& t, const char* label);
  Tensor linear(Device& dev, Module& m, const char* w, const char* b, const Tensor& x,
                std::int64_t out_features, const char* label);
  // dx (when want_dx) of y = x W^T + b; accumulates dW (and db) into the params.
  Tensor linear_backward(Device& dev, Module& m, const char* w, const char* b, const Tensor& dy,
                         const Tensor& x, bool want_dx);
  // With grad_ false (a checkpointed layer's forward, Note [Gradient checkpointing]) `a` keeps
  // nothing past its last forward use.
  Tensor block_forward(Device& dev, Module& blk, BlockActs& a, const Tensor& x);
  // A checkpointed layer's backward: recompute, then block_backward.
  Tensor checkpointed_block_backward(Device& dev, std::size_t l, const Tensor& dx3);
  Tensor block_backward(Device& dev, Module& blk, BlockActs& a, const Tensor& dx3);
  Tensor head_probs(Device& dev, const BlockActs& a, std::int64_t b, std::int64_t h,
                    Tensor& scores);
  Tensor attention_forward(Device& dev, BlockActs& a);
  void attention_backward(Device& dev, BlockActs& a, const Tensor& do_tok, Tensor& dq,
                          Tensor& dk, Tensor& dv);
  Tensor mlp_forward(Device& dev, Module& blk, BlockActs& a);
  Tensor mlp_backward(Device& dev, Module& blk, BlockActs& a, const Tensor& dm);
  Tensor moe_forward(Device& dev, Module& blk, BlockActs& a);
  Tensor moe_backward(Device& dev, Module& blk, BlockActs& a, const Tensor& dm);
  // The slot tables of a routing, uploaded (or allocated, in meta mode).
  void moe_slot_tables(Device& dev, BlockActs& a, const MoeRoute& r);
  // [E*C, d] in token-side layout to the experts' ranks and back (identity without a group).
  Tensor moe_exchange(Device& dev, const Tensor& t, const char* label);
  int ep_size() const { return ep_ == nullptr ? 1 : ep_->size(); }
  int local_experts() const { return spec_.experts / ep_size(); }

  TransformerSpec spec_;
  Comm* ep_ = nullptr;
  std::vector<BlockActs> acts_;
  std::vector<Tensor> layer_inputs_;  // checkpointed layers' saved inputs (on host_ with cpu_checkpointing)
  // deepspeed.checkpointing under partition_activations: each layer's torch.tensor(arg.size()) per
  // tensor argument (Note [Gradient checkpointing]), kept with its partition.
  std::vector<Tensor> ds_arg_sizes_;
  std::vector<Tensor> contiguous_;    // deepspeed.checkpointing's contiguous buffers, until the first backward
  std::size_t contiguous_next_ = 0;   // the next of them (DeepSpeed's data_offsets)
  // deepspeed.checkpointing.checkpoint's forward of layer l's input: what it keeps.
  Tensor ds_checkpoint_input(Device& dev, std::size_t l, const Tensor& x);
  bool grad_ = true;  // false while a checkpointed layer runs its forward without grad
  NormActs normf_;  // the final norm's
  Tensor forward_workspace_, backward_workspace_;  // TransformerSpec::blas_workspace_bytes
  Tensor ids_, labels_, positions_, hf_, logp_;
  // Hugging Face's tensors beside the layers: position ids, causal mask, rotary cos/sin, and the
  // loss's shifted labels (Note [Hugging Face's saved tensors]).
  Tensor position_ids_, mask_, rope_cs_, target_, total_weight_;
  Tensor inputs_embeds_, position_embeds_;  // GPT-2's, until the model's forward returns
  std::int64_t batch_ = 0;
};

}  // namespace zc
