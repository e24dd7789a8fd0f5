"""The torch twin of a zerocheck model and the scenario's call sequence on a DeepSpeed engine.

Twins (the same params, in the same order, with the same names as zerocheck's model):
- synthetic: params p0, p1, ... of the given shapes; loss = sum_i <p_i, mean over samples of g_i>,
  so autograd gives exactly the prescribed gradient (models/synthetic.h).
- mlp: Linear layers layers.0, layers.1, ... (weight [out, in], bias [out]), ReLU between layers
  when enabled, linear loss sum(c * out) / B (models/mlp.h).
- transformer: the tiny presets of models/transformer.h, op by op as Hugging Face's eager GPT-2 and
  Llama compute them (TransformerTwin), on zerocheck's module tree and param names; mixtral-tiny's
  MLPs are DeepSpeed's own MoE layer, its router and experts mapped to zerocheck's names
  (zc_named_parameters) and recorded in zerocheck's order (record_order, record_flat).
Initial weights and every global batch come from zerocheck's files, already rounded to the model
dtype, so every conversion here is exact.

The record (record.py) holds, per step s: grads/s (every param's full gradient at the boundary,
before step, in param order), params/s (the 16-bit or fp32 model params after step), masters/s
(the full fp32 master params after step), loss_scale/s, skipped/s (engine.skipped_steps),
msid/s (micro_step_id at the coalesce flush, when coalescing), opt/<key>/s (every param's full
optimizer state after step: exp_avg, exp_avg_sq, momentum_buffer), and
comm/<kind> (calls, bytes) over the whole run, getters excluded.
"""
import contextlib
import json
import math
import os
import re

import torch

import deepspeed
import deepspeed.comm as dist
from deepspeed.runtime.activation_checkpointing import checkpointing as ds_checkpointing
from deepspeed.moe.utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer
from deepspeed.utils import groups as ds_groups
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state

import memory
import record
from transformer_twin import TransformerTwin

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "int64": torch.int64}


# The reference's one patch of DeepSpeed, for the recorder's getters only (a finding about
# DeepSpeed 0.19.8, docs/fidelity.md, point 10). With round_robin_gradients the ZeRO-1/2
# flat buffer holds the params in round-robin order, but _link_all_hp_params
# (runtime/zero/stage_1_and_2.py:824-850) passes link_hp_params the params in group order and
# their offsets only when parameter_alignment padding exists (`if any(round_robin_bit16_padding)`);
# without padding (the default) it walks the group order as if it were the buffer's, so every
# lp -> hp fragment mapping points at another param's slice. safe_get_full_grad then raises a size
# mismatch or returns another param's values, and so do safe_get_full_fp32_param,
# safe_get_full_optimizer_state and everything else that reads _hp_mapping. Training itself steps
# the flat partitions and is not affected. The patch passes the buffer offsets always when
# round_robin_gradients is on, which is the padded branch's own code; without round robin the
# original method runs unchanged.
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: E402
from deepspeed.utils import link_hp_params  # noqa: E402

_original_link_all_hp_params = DeepSpeedZeroOptimizer._link_all_hp_params


def _link_all_hp_params_with_round_robin_offsets(self):
    if not self.round_robin_gradients:
        return _original_link_all_hp_params(self)
    if self.cpu_offload:
        self._get_offload_gradient_dict()
    for i, _ in enumerate(self.optimizer.param_groups):
        group = self.real_dp_process_group[i]
        partition_id = dist.get_rank(group=group)
        partition_size = self.bit16_groups_flat[i].numel() // dist.get_world_size(group=group)
        offset_by_param = {id(p): o for p, o in zip(self.round_robin_bit16_groups[i], self.round_robin_bit16_offsets[i])}
        link_hp_params(lp_param_list=self.bit16_groups[i],
                       flat_hp_partition=self.single_partition_of_fp32_groups[i],
                       gradient_dict=self.averaged_gradients,
                       offload_gradient_dict=self.offload_gradient_dict,
                       use_offload=self.cpu_offload,
                       param_group_index=i,
                       partition_start=partition_id * partition_size,
                       partition_size=partition_size,
                       dp_group=group,
                       param_offsets=[offset_by_param[id(p)] for p in self.bit16_groups[i]])


DeepSpeedZeroOptimizer._link_all_hp_params = _link_all_hp_params_with_round_robin_offsets


class SyntheticTwin(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        for i, shape in enumerate(shapes):
            self.register_parameter(f"p{i}", torch.nn.Parameter(torch.zeros(shape)))
        self.count = len(shapes)

    def forward(self, **batch):
        loss = None
        for i in range(self.count):
            g = batch[f"g{i}"]  # [B, numel]
            mean = g.sum(0) / g.shape[0]
            term = (getattr(self, f"p{i}").flatten() * mean).sum()
            loss = term if loss is None else loss + term
        return loss


class MlpTwin(torch.nn.Module):
    def __init__(self, dims, relu):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(dims[i], dims[i + 1]) for i in range(len(dims) - 1))
        self.relu = relu

    def forward(self, x, c):
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if self.relu and i + 1 < len(self.layers):
                h = torch.relu(h)
        return (c * h).sum() / x.shape[0]


def configure_checkpointing(spec):
    """deepspeed.checkpointing's module-wide settings for this scenario: a model that calls it
    configures it from the ds_config (configure(mpu, deepspeed_config)); every scenario sets them
    again, so that one scenario's settings never reach the next."""
    if spec["model"].get("checkpointing", "").startswith("deepspeed"):
        ds_checkpointing.configure(None, deepspeed_config=spec["ds_config"])
    else:
        ds_checkpointing.configure(None)


def build_twin(spec):
    m = spec["model"]
    if m["kind"] == "synthetic":
        model = SyntheticTwin([tuple(s) for s in m["shapes"]])
    elif m["kind"] == "mlp":
        model = MlpTwin(m["dims"], m["relu"])
    elif m["kind"] == "transformer":
        model = TransformerTwin(m, spec["params"])
    else:
        raise ValueError(f"the twin has no model kind {m['kind']!r}")
    names = [n for n, _ in zc_named_parameters(model, spec)]
    want = [p["name"] for p in spec["params"]]
    if moe_ep_size(spec):  # this rank's experts only (Note [MoE routing])
        have = set(names)
        want = [n for n in want if not re.fullmatch(r".*\.expert\d+_\w+", n) or n in have]
    if names != want:
        raise ValueError(f"twin params {names} differ from zerocheck's {want}")
    return model


def moe_ep_size(spec):
    """The MoE layers' ep_size, or 0 for a model without experts."""
    m = spec["model"]
    return m.get("ep_size", 1) if m.get("experts", 0) else 0


def zc_named_parameters(model, spec):
    """(zerocheck's name, param) in the twin's param order: an MoE twin maps DeepSpeed's names."""
    if moe_ep_size(spec):
        return model.zc_named_parameters(dist.get_rank() % moe_ep_size(spec))
    return list(model.named_parameters())


def moe_param_groups(model):
    """The optimizer's param groups DeepSpeed's ZeRO-1/2 needs for MoE: the dense params, then the
    experts in a group marked moe (split_params_into_different_moe_groups_for_optimizer)."""
    return split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "dense"})


def record_order(params, spec):
    """The params in the order zerocheck records them (Engine::full_params): the dense ones in model
    order, then the experts (this rank's, in model order; gathered over the expert-parallel group
    by record_flat)."""
    if not moe_ep_size(spec):
        return params
    return [p for p in params if not is_moe_param(p)] + [p for p in params if is_moe_param(p)]


def record_flat(tensors, params, spec):
    """flat(tensors), with an MoE model's expert part gathered over the expert-parallel group in
    rank order, as Engine::append_experts does (torch.distributed directly: not a counted call)."""
    ep = moe_ep_size(spec)
    if ep <= 1:
        return flat(tensors)
    n_dense = sum(1 for p in params if not is_moe_param(p))
    dense, mine = flat(tensors[:n_dense]), flat(tensors[n_dense:])
    parts = [torch.empty_like(mine) for _ in range(ep)]
    torch.distributed.all_gather(parts, mine, group=ds_groups._get_expert_parallel_group(f"ep_size_{ep}"))
    return torch.cat([dense] + parts)


def load_init(model, spec, directory):
    values = record.read_f64(os.path.join(directory, "init.f64"))
    offsets, at = {}, 0
    for p in spec["params"]:
        offsets[p["name"]] = at
        at += math.prod(p["shape"])
    if at != len(values):
        raise ValueError(f"init.f64 has {len(values)} values, the params {at}")
    with torch.no_grad():
        for name, p in zc_named_parameters(model, spec):
            at = offsets[name]
            p.copy_(torch.tensor(values[at:at + p.numel()], dtype=torch.float64).reshape(p.shape))


def load_batches(spec, directory, rank, dtype):
    """{(s, m, c): {name: tensor [B, ...]}} for this rank's slice of every global batch."""
    values = record.read_f64(os.path.join(directory, "batches.f64"))
    W, B = spec["world"], spec["micro_batch"]
    out, at = {}, 0
    for s in range(spec["steps"]):
        for m in range(spec["ga"]):
            for c in range(spec["n"]):
                arrays = {}
                for a in spec["batch_arrays"]:
                    row = a["row"]
                    full = torch.tensor(values[at:at + W * B * row], dtype=torch.float64).reshape(W * B, row)
                    at += W * B * row
                    arrays[a["name"]] = full[rank * B:(rank + 1) * B].to(DTYPES.get(a.get("dtype"), dtype))
                out[(s, m, c)] = arrays
    if at != len(values):
        raise ValueError(f"batches.f64 has {len(values)} values, the scenario reads {at}")
    return out


def gathered(engine, params, stage):
    """The full model params (16-bit or fp32) on every rank; ZeRO-3 gathers them."""
    if stage == 3:
        # GatheredParameters' exit partitions every param it was given, persistent ones too
        # (partition_parameters.py:2544), which DeepSpeed's own step never does: the params that
        # were AVAILABLE before the read are gathered back (the caller has counting off), so the
        # next forward runs from the state training left, as it would without the recorder.
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
        available = [p for p in params if p.ds_status == ZeroParamStatus.AVAILABLE]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            out = [p.detach().clone() for p in params]
        if available:
            available[0].all_gather(param_list=available)
        return out
    return [p.detach().clone() for p in params]


def full_grads(engine, params, stage):
    if stage == 0:
        # No ZeRO optimizer: the reduced gradient is each param's .grad.
        return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    out = []
    for p in params:
        g = safe_get_full_grad(p)
        out.append(torch.zeros_like(p) if g is None else g.detach().clone())
    return out


def full_masters(engine, params, stage):
    if stage > 0:
        return [safe_get_full_fp32_param(p).detach().clone() for p in params]
    opt = engine.optimizer
    if hasattr(opt, "fp32_groups_flat") and hasattr(opt, "fp16_groups"):  # FP16_Optimizer (bf16 stage 0)
        out = []
        for flat_master, group in zip(opt.fp32_groups_flat, opt.fp16_groups):
            out.extend(torch._utils._unflatten_dense_tensors(flat_master, group))
        return out
    if hasattr(opt, "fp32_groups"):  # FP16_UnfusedOptimizer (SGD, torch_adam)
        return [m for group in opt.fp32_groups for m in group]
    return [p.detach().float().clone() for p in params]  # fp32 stage 0: the params are the masters


def full_optimizer_state(engine, params, stage, key):
    """Every param's full optimizer state `key` in param order, or None where the optimizer keeps
    none (before its first step, SGD without momentum)."""
    if stage in (1, 2) and len(engine.optimizer.optimizer.param_groups) > 1:
        # DeepSpeed 0.19.8 steps ZeRO-1/2's param groups one at a time and links every group's
        # optimizer state to its params after the first group's step, once
        # (_optimizer_step -> _lazy_init_hp_params_optimizer_state, stage_1_and_2.py:2987): the
        # later groups (MoE's experts) are linked to no state, and safe_get_full_optimizer_state
        # raises "exp_avg not found" for their params forever after (docs/deepspeed-reference.md, defects). Linking
        # again once every group has stepped is the getter's fix; training is not affected.
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    if stage > 0:
        states = [safe_get_full_optimizer_state(p, key) for p in params]
        return states if all(t is not None for t in states) else None
    # Stage 0: the base optimizer's own state, over the tensors it steps: the params (fp32), or
    # FP16_Optimizer's flat fp32 groups, or FP16_UnfusedOptimizer's per-param fp32 copies, which
    # all hold the params in order.
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    states = []
    for group in base.param_groups:
        for p in group["params"]:
            t = base.state.get(p, {}).get(key)
            if t is None:
                return None
            states.append(t)
    return states


def flat(tensors):
    return torch.cat([t.detach().double().flatten() for t in tensors]) if tensors else torch.zeros(0)


def loss_scale_of(engine):
    v = engine._get_optimizer_loss_scale()
    if v is not None:
        return float(v.item()) if torch.is_tensor(v) else float(v)
    opt = engine.optimizer
    for attr in ("cur_scale", "loss_scale"):
        v = getattr(opt, attr, None)
        if isinstance(v, (int, float)):
            return float(v)
        if torch.is_tensor(v):
            return float(v.item())
    return 1.0


def watch_flush(engine, stage, msids):
    """Records micro_step_id at each coalesce flush as zerocheck does (engine.cpp
    flush_coalesced_reduction): stage 3 as the flush starts, stages 1/2 after setup_buckets."""
    if stage == 3:
        inner = engine._flush_coalesced_reduction_zero3

        def flush3(optimizer):
            msids.append(float(optimizer.micro_step_id))
            return inner(optimizer)
        engine._flush_coalesced_reduction_zero3 = flush3
    else:
        inner = engine._flush_coalesced_reduction_zero12

        def flush12(optimizer):
            result = inner(optimizer)
            msids.append(float(optimizer.micro_step_id))
            return result
        engine._flush_coalesced_reduction_zero12 = flush12


class _NoMemory:
    """The recorder's interface doing nothing (a scenario without "memory")."""
    @contextlib.contextmanager
    def _nothing(self):
        yield

    def mark(self, name):
        pass

    def snapshot(self, engine=None, module=None):
        pass

    def watch_grads(self, module):
        pass

    def watch_step_grads(self, optimizer):
        pass

    def labelled(self, category):
        return self._nothing()

    excluded = reading = forward = _nothing


def wants_memory(directory):
    with open(os.path.join(directory, "input.json")) as f:
        return bool(json.load(f).get("memory"))


def run_scenario(directory, counter, measure_memory=True):
    """The scenario's record entries; with "memory" in input.json (and measure_memory), also writes
    rank{R}.mem.json (memory.py: DeepSpeed's CPU allocations by category, construction and each step)."""
    with open(os.path.join(directory, "input.json")) as f:
        spec = json.load(f)
    spec["memory"] = spec.get("memory", False) and measure_memory
    rank = dist.get_rank()
    if dist.get_world_size() != spec["world"]:
        raise ValueError(f"scenario world {spec['world']} sent to a pool of {dist.get_world_size()}")
    dtype = DTYPES[spec["dtype"]]
    stage = spec["ds_config"].get("zero_optimization", {}).get("stage", 0)
    configure_checkpointing(spec)
    mem = memory.MemoryRecorder() if spec.get("memory") else _NoMemory()
    if spec.get("memory"):
        mem.start()
    mem.mark("begin:construction")
    # The model is built in the scenario's dtype, as users build theirs (from_pretrained's
    # torch_dtype, zero.Init's dtype) and as the engine and a plan count it; built in f32 and cast
    # by DeepSpeed's engine, construction would hold both copies at once.
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = build_twin(spec)
    finally:
        torch.set_default_dtype(default_dtype)
    # Every engine model takes autograd's grad as .grad, as AccumulateGrad does.
    mem.watch_grads(model)
    with mem.excluded():  # the twin's own staging of zerocheck's values
        load_init(model, spec, directory)
        batches = load_batches(spec, directory, rank, dtype)
    mem.snapshot(module=model)
    counter.reset()
    counter.counting = True
    groups = moe_param_groups(model) if moe_ep_size(spec) else model.parameters()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=spec["ds_config"])
    mem.snapshot(engine)
    mem.watch_step_grads(engine.optimizer)
    params = record_order(list(engine.module.parameters()), spec)
    if params[0].dtype != dtype:
        raise ValueError(f"DeepSpeed holds the model in {params[0].dtype}, the scenario says {dtype}")
    entries, msids = [], []
    if spec["coalesce"]:
        watch_flush(engine, stage, msids)
    ga, n = spec["ga"], spec["n"]
    # Under torch's checkpoint the last micro-step's loss, and the autograd graph behind it, live
    # until the next forward, as in a loop that rebinds `loss = engine(batch)`: each layer's
    # run_function keeps what Hugging Face passes it by keyword as long, as the engine's
    # transformer models it (Note [Gradient checkpointing] in models/transformer.h). Otherwise the
    # loss goes after the backward, as the engine's loop frees it.
    hold_loss = spec["model"].get("checkpointing", "") == "torch"
    held = {}
    for s in range(spec["steps"]):
        mem.mark(f"begin:step{s}")
        for m in range(ga):
            def chunks():
                for c in range(n):
                    if spec["explicit_boundary"] and not spec["coalesce"]:
                        engine.set_gradient_accumulation_boundary(m + 1 == ga and c + 1 == n)
                    with mem.labelled("activations"):  # the loop's upload of the micro-batch, as the engine's
                        mine = {k: v.clone() for k, v in batches[(s, m, c)].items()}
                    held.clear()
                    with mem.forward():
                        loss = engine(**mine)
                    mem.snapshot(engine)
                    if m == 0 and c == 0:
                        mem.mark("after_forward")
                    engine.backward(loss)
                    if hold_loss:
                        held["loss"] = loss
                    del mine, loss  # the batch freed after backward, as the engine's loop frees its Batch
                    mem.snapshot(engine)
            if spec["coalesce"]:
                with engine.coalesce_grad_reduction():
                    chunks()
            else:
                chunks()
            if m + 1 == ga:
                counter.counting = False
                with mem.reading():
                    entries.append((f"grads/{s}", record_flat(full_grads(engine, params, stage), params, spec)))
                    entries.append((f"loss_scale/{s}", [loss_scale_of(engine)]))
                counter.counting = True
            engine.step()
            mem.snapshot(engine)
        mem.mark("after_step")
        counter.counting = False
        with mem.reading():
            entries.append((f"params/{s}", record_flat(gathered(engine, params, stage), params, spec)))
            entries.append((f"masters/{s}", record_flat(full_masters(engine, params, stage), params, spec)))
            entries.append((f"skipped/{s}", [float(engine.skipped_steps)]))
            for key in spec.get("optimizer_state_keys", []):
                states = full_optimizer_state(engine, params, stage, key)
                if states is not None:
                    entries.append((f"opt/{key}/{s}", record_flat(states, params, spec)))
        counter.counting = True
    counter.counting = False
    held.clear()
    mem.mark("begin:destroy")
    if msids:
        entries.append(("msid", msids))
    entries.extend(counter.entries())
    engine.destroy()
    if spec.get("memory"):
        try:
            measured = mem.finish()
        except Exception as e:  # the profiler's failure ends the memory comparison, not the values'
            measured = {"error": f"memory.py: {type(e).__name__}: {e}"}
        with open(os.path.join(directory, f"rank{rank}.mem.json"), "w") as f:
            json.dump(measured, f)
    return entries
