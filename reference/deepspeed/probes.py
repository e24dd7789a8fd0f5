"""Checks of DeepSpeed itself that are not a training record (worker command "probe"): each returns
a JSON-able dict of named facts with the evidence, written to <dir>/probe_<name>.json by rank 0.

i4: SPEC 7's invariant I4 on a ZeRO-3 module of DeepSpeed 0.19.8. Its _parameters are a
ZeROOrderedDict (runtime/zero/parameter_offload.py); copy.copy and copy.deepcopy must keep a
_parent_module (bug B5 lost it through the default __reduce__), __reduce__ must carry it, and a
fake tensor (torch's FakeTensorMode, as tracing makes) read through the dict during an eager
forward must not have its ds_status read (bug B6). A full pickle round trip of the dict cannot
succeed (ZeRO-3 params hold process groups and closures); the probe records that it fails and how.
"""
import copy
import os
import pickle
import traceback

import torch

import deepspeed

import twin


def _stage3_engine():
    model = twin.MlpTwin([3, 4, 2], relu=True)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
              "optimizer": {"type": "SGD", "params": {"lr": 0.125}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def probe_i4():
    engine = _stage3_engine()
    facts = {}
    try:
        layer = engine.module.layers[0]
        d = layer._parameters
        facts["dict_type"] = type(d).__name__
        facts["partitioned"] = all(getattr(p, "ds_status", None) is not None and p.ds_status.name == "NOT_AVAILABLE"
                                   for p in layer.parameters())
        shallow = copy.copy(d)
        facts["copy_keeps_parent"] = getattr(shallow, "_parent_module", None) is layer
        try:
            deep = copy.deepcopy(d)
            parent = getattr(deep, "_parent_module", None)
            facts["deepcopy_keeps_parent"] = parent is not None
            facts["deepcopy_parent_is_a_copy"] = parent is not None and parent is not layer
        except Exception as e:  # recorded: a deepcopy that cannot run is a finding too
            facts["deepcopy_keeps_parent"] = False
            facts["deepcopy_error"] = f"{type(e).__name__}: {e}"[:300]
        reduced = d.__reduce__()
        facts["reduce_carries_parent"] = len(reduced) > 1 and len(reduced[1]) > 0 and reduced[1][0] is layer
        try:
            pickle.loads(pickle.dumps(d))
            facts["pickle_round_trip"] = "succeeded"
        except Exception as e:
            facts["pickle_round_trip"] = f"fails: {type(e).__name__}: {e}"[:300]
        from torch._subclasses.fake_tensor import FakeTensorMode
        from deepspeed.runtime.zero.parameter_offload import ZeROOrderedDict
        with FakeTensorMode() as mode:
            fake = torch.nn.Parameter(mode.from_tensor(torch.zeros(4, 3)))
        fake_dict = ZeROOrderedDict(layer)
        fake_dict["weight"] = fake
        layer._parameters._in_forward = True  # an eager forward, where the getter would gather
        try:
            got = fake_dict["weight"]
            facts["fake_param_read_without_ds_status"] = got is fake
        except AttributeError as e:
            facts["fake_param_read_without_ds_status"] = False
            facts["fake_param_error"] = str(e)[:300]
        finally:
            layer._parameters._in_forward = False
        facts.update(_controls(layer, fake))
        facts["holds"] = bool(facts["control_b5_detected"] and facts["control_b6_detected"] and facts["dict_type"] == "ZeROOrderedDict" and facts["copy_keeps_parent"] and
                              facts["deepcopy_keeps_parent"] and facts["reduce_carries_parent"] and
                              facts["fake_param_read_without_ds_status"])
    finally:
        engine.destroy()
    return facts


def _controls(layer, fake):
    """Negative controls: the same checks on the historical forms of the dict must fail, so the probe
    can see B5 and B6 when they are there."""
    from collections import OrderedDict

    from deepspeed.runtime.zero.parameter_offload import ZeROOrderedDict

    class PreB5(ZeROOrderedDict):  # the default reduce: no parent in the constructor arguments
        __reduce__ = OrderedDict.__reduce__

    class PreB6(ZeROOrderedDict):  # the status read without asking whether the param has one
        def __getitem__(self, key):
            param = OrderedDict.__getitem__(self, key)
            if self._parent_module._parameters._in_forward and param.ds_status is not None:
                pass
            return param

    out = {}
    old = PreB5(layer)
    try:
        out["control_b5_detected"] = getattr(copy.copy(old), "_parent_module", None) is not layer
    except Exception as e:  # the copy cannot even be made: detected
        out["control_b5_detected"] = True
        out["control_b5_error"] = f"{type(e).__name__}: {e}"[:200]
    pre6 = PreB6(layer)
    pre6["weight"] = fake
    layer._parameters._in_forward = True
    try:
        pre6["weight"]
        out["control_b6_detected"] = False
    except AttributeError as e:
        out["control_b6_detected"] = True
        out["control_b6_error"] = str(e)[:200]
    finally:
        layer._parameters._in_forward = False
    return out


PROBES = {"i4": probe_i4}


# I3 on DeepSpeed (SPEC's invariant I3): with only parallelization passes (autosp, autotp), the
# DeepCompile runtime must never be loaded. DeepCompile's handle is get_deepcompile_handle()
# (deepspeed/compile/util.py:48), which loads DeepCompileBuilder once into the module global
# dc_handle; six modules import the function by name. The recorder replaces the builder (so every
# load is seen, whoever calls) and wraps the name in each importing module (so every request is
# seen), and checks both on itself first: each of the six names, called once, must be counted.
_HANDLE_SITES = ["deepspeed.compile.util", "deepspeed.compile.backend", "deepspeed.compile.profilers.graph_profile",
                 "deepspeed.compile.passes.zero_1_and_2_compile", "deepspeed.compile.passes.zero3_compile",
                 "deepspeed.compile.passes.selective_gather", "deepspeed.runtime.engine"]


class _HandleRecorder:
    def __init__(self):
        self.requests = []  # (module, ) per get_deepcompile_handle call
        self.loads = 0
        self.calls = []     # handle methods called

    def handle(self):
        recorder = self

        class Handle:
            def __getattr__(self, name):
                def method(*args, **kwargs):
                    recorder.calls.append(name)
                return method
        return Handle()


def _install_recorder():
    import importlib

    import deepspeed.compile.util as util

    rec = _HandleRecorder()
    saved = {"builder": util.DeepCompileBuilder, "dc_handle": util.dc_handle, "names": {}}

    class Builder:
        def load(self):
            rec.loads += 1
            return rec.handle()

    util.DeepCompileBuilder = Builder
    util.dc_handle = None
    for site in _HANDLE_SITES:
        try:  # a release without one of the importing modules (seed_checks runs any release)
            mod = importlib.import_module(site)
        except ImportError:
            continue
        fn = getattr(mod, "get_deepcompile_handle", None)
        if fn is None:
            continue
        saved["names"][site] = fn

        def counted(fn=fn, site=site):
            rec.requests.append(site)
            return fn()
        mod.get_deepcompile_handle = counted

    # AutoSP's backend (compile/init_sp.py:17, passes/long_context_checkpointing.py:92) replaces
    # torch's solve_min_cut with code exec'd from inspect.getsource of the original; a second AutoSP
    # compile in the same process then raises "OSError: could not get source code". The probe puts
    # the original back after each engine, so each run sees a fresh process's partitioner.
    from torch._functorch import partitioners
    saved["solve_min_cut"] = partitioners.solve_min_cut

    def restore():
        partitioners.solve_min_cut = saved["solve_min_cut"]
        util.DeepCompileBuilder = saved["builder"]
        util.dc_handle = saved["dc_handle"]
        for site, fn in saved["names"].items():
            importlib.import_module(site).get_deepcompile_handle = fn
    return rec, restore


class _Attention(torch.nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.head_dim = head_dim
        self.q_proj = torch.nn.Linear(dim, dim, bias=False)
        self.k_proj = torch.nn.Linear(dim, dim, bias=False)
        self.v_proj = torch.nn.Linear(dim, dim, bias=False)
        self.o_proj = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s = x.shape[0], x.shape[1]

        # Heads from the projection's own width: under AutoTP each rank holds dim / tp of q, k, v
        # (column-parallel) and o_proj's input is that width (row-parallel).
        def heads(t):
            return t.view(b, s, -1, self.head_dim).transpose(1, 2)

        a = torch.nn.functional.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)),
                                                             heads(self.v_proj(x)), is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))


class AttentionTwin(torch.nn.Module):
    """A one-layer causal attention language model (embedding, attn.{q,k,v,o}_proj, SDPA, output
    head, cross entropy): the smallest graph AutoSP's pass recognises (it shards the sequence of the
    tagged input ids and labels around an SDPA node), and one AutoTP partitions through a custom
    partition_config (q/k/v column-parallel, o row-parallel; the head is not named lm_head, which
    AutoTP would make an LmHeadLinearAllreduce that its compile pass refuses)."""

    def __init__(self, vocab=32, dim=16, head_dim=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.attn = _Attention(dim, head_dim)
        self.out_head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, labels, position_ids=None):
        logits = self.out_head(self.attn(self.embed(input_ids)))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


_AUTOTP_PARTITION = {"use_default_specs": False,
                     "layer_specs": [{"patterns": [r".*\.[qkv]_proj\.weight$"], "partition_type": "column"},
                                     {"patterns": [r".*\.o_proj\.weight$"], "partition_type": "row"}]}


def _error(e):
    """The exception and where it was raised: the innermost frame in DeepSpeed and the innermost
    frame of all (file relative to site-packages, line, function)."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)

    def site(f):
        path = f.filename.split("site-packages/")[-1]
        return f"{path}:{f.lineno} {f.name}"

    ds = [f for f in frames if "site-packages/deepspeed/" in f.filename]
    return {"error": f"{type(e).__name__}: {e}"[:400], "deepspeed_frame": site(ds[-1]) if ds else "-",
            "innermost_frame": site(frames[-1]) if frames else "-"}


def _b1_gate(engine_cls):
    """Bug B1's historical backward gate: DeepCompile hooks unless autotp (autosp not exempt)."""
    engine_cls.uses_parallelization_pass_only = lambda self: self.compile_autotp()


def _b2_gate(engine_cls):
    """Bug B2's historical destroy: the runtime's cleanup() under deepcompile_active alone."""
    import deepspeed.runtime.engine as engine_mod

    def cleanup(self):
        self._deepcompile_native_initialized = False
        if self._deepcompile_active:
            engine_mod.get_deepcompile_handle().cleanup()
    engine_cls._cleanup_deepcompile_native = cleanup


def _i3_run(stage, passes, steps=2, mutant=None):
    """One engine through compile, `steps` x (forward, backward, step) and destroy, as DeepSpeed's
    own tests drive these passes (tests/unit/v1/compile/test_compile_autosp.py: sequence_parallel_size
    = world, compile with dynamic shapes, inputs tagged; AutoTP through tensor_parallel.autotp_size and
    a partition_config). Records how far the lifecycle got, with the error and its DeepSpeed frame
    where it stopped, which backend compile installed, and what the recorder saw."""
    import torch.distributed as tdist
    from deepspeed.compile import constants

    from deepspeed.runtime.engine import DeepSpeedEngine

    rec, restore = _install_recorder()
    world = tdist.get_world_size()
    out = {"stage": stage, "passes": passes, "reached": "setup"}
    engine = None
    saved_methods = {k: DeepSpeedEngine.__dict__[k] for k in ("uses_parallelization_pass_only",
                                                             "_cleanup_deepcompile_native")
                     if k in DeepSpeedEngine.__dict__}
    if mutant:
        out["mutant"] = mutant
        {"b1": _b1_gate, "b2": _b2_gate}[mutant](DeepSpeedEngine)
    try:
        torch.manual_seed(0)
        model = AttentionTwin()
        config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.125}},
                  "zero_optimization": {"stage": stage},
                  "compile": {"deepcompile": True}}
        if passes:
            config["compile"]["passes"] = passes
        if "autosp" in passes:
            config["sequence_parallel_size"] = world
        if "autotp" in passes:
            config["tensor_parallel"] = {"autotp_size": world, "partition_config": _AUTOTP_PARTITION}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        out["reached"] = "initialize"
        engine.compile(backend="inductor", compile_kwargs={"dynamic": True} if "autosp" in passes else {})
        out["reached"] = "compile"
        out["deepcompile_active"] = bool(engine.is_deepcompile_active())
        for i in range(steps):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 32, (1, 8), generator=g)
            labels = torch.randint(0, 32, (1, 8), generator=g)
            pos = torch.arange(8).unsqueeze(0)
            if "autosp" in passes:
                ids.tag, labels.tag = constants.AUTOSP_INPUT_ID_KEY, constants.AUTOSP_LABEL_ID_KEY
                pos.tag = constants.AUTOSP_POSITION_ID_KEY
            loss = engine(input_ids=ids, labels=labels, position_ids=pos)
            out["reached"] = f"forward {i + 1}"
            engine.backward(loss)
            out["reached"] = f"backward {i + 1}"
            engine.step()
            out["reached"] = f"step {i + 1}"
            out.setdefault("losses", []).append(float(loss))
        out["lifecycle_complete_before_destroy"] = True
    except Exception as e:
        out["stopped"] = _error(e)
    finally:
        if engine is not None:
            try:
                engine.destroy()
                out["destroyed"] = True
            except Exception as e:
                out["destroyed"] = False
                out["destroy_error"] = _error(e)
        for k, v in saved_methods.items():
            setattr(DeepSpeedEngine, k, v)
        restore()
        torch._dynamo.reset()
    out["handle_requests"] = sorted(set(rec.requests))
    out["handle_loads"] = rec.loads
    out["handle_calls"] = sorted(set(rec.calls))
    # I3's second half: no runtime call before init().
    out["calls_before_init"] = rec.calls[:rec.calls.index("init")] if "init" in rec.calls else list(rec.calls)
    out["handle_requested"] = bool(rec.requests or rec.loads)
    return out


# Lifecycles DeepSpeed 0.19.8 itself cannot finish: AutoTP at stage 3, whose forward under
# fullgraph=True Dynamo refuses (PartitionedParameterCoordinator.reset_step, runtime/engine.py:3007).
# Each must still get through compile; every other lifecycle must complete, or the probe fails.
_I3_EXPECTED_INCOMPLETE = {"stage 3 autotp": "compile"}


def probe_i3(runs=None):
    """runs: "pass:stage,..." (for instance "autosp:0,autotp:0"); zerocheck always sends it. Without
    it (probe.sh), ZC_I3_RUNS, else all eight. AutoSP lifecycles run before AutoTP ones whatever the
    order given (an AutoTP engine leaves DeepSpeed's TP groups behind)."""
    import importlib

    facts = {}
    # The recorder on itself: every importing name is counted, and a load goes through the builder.
    rec, restore = _install_recorder()
    try:
        for site in _HANDLE_SITES:
            importlib.import_module(site).get_deepcompile_handle()
        facts["recorder_sees_every_site"] = sorted(set(rec.requests)) == sorted(_HANDLE_SITES) and rec.loads == 1
    finally:
        restore()
    only = runs if runs is not None else os.environ.get("ZC_I3_RUNS")
    pairs = ([(p.split(":")[0], int(p.split(":")[1])) for p in only.split(",") if p] if only else
             [(p, stage) for p in ("autosp", "autotp") for stage in (0, 1, 2, 3)])
    pairs.sort(key=lambda ps: (ps[0] != "autosp", ps[1]))
    # Positive control: DeepCompile's own ZeRO-1 pass must request the handle on the same model. It
    # runs first: an AutoTP engine leaves DeepSpeed's process-wide TP groups (runtime/engine.py:957,
    # groups._init_tp_mesh_device) behind, and a later engine without TP then fails in
    # _configure_distributed_model (engine.py:2169, mpu None with mp_world_size 2).
    control = _i3_run(1, [])
    # Negative controls: the probe must see the handle requested when B1's or B2's historical gate
    # is put back (AutoSP at stage 0, where compile installs AutoSP's backend). Before the AutoTP
    # runs, for the same reason as the control.
    mutants = [_i3_run(0, ["autosp"], steps=1, mutant=m) for m in ("b1", "b2")]
    runs = [_i3_run(stage, [p]) for p, stage in pairs]
    facts["mutants"] = mutants
    facts["mutants_detected"] = {r["mutant"]: r["handle_requested"] for r in mutants}
    name = lambda r: f"stage {r['stage']} {r['passes'][0]}"  # noqa: E731
    facts["runs"] = runs
    facts["control_z1_deepcompile"] = control
    facts["control_detected"] = control["handle_requested"]
    facts["handle_requested_with_parallel_passes"] = [name(r) for r in runs if r["handle_requested"]]
    facts["complete_lifecycles"] = [name(r) for r in runs
                                    if r.get("lifecycle_complete_before_destroy") and r.get("destroyed")]
    facts["incomplete_lifecycles"] = {name(r): {"reached": r["reached"], **r.get("stopped", {})}
                                      for r in runs if name(r) not in facts["complete_lifecycles"]}
    # A lifecycle that stopped where DeepSpeed is not known to stop proves nothing about I3.
    facts["unexpectedly_incomplete"] = {n: v for n, v in facts["incomplete_lifecycles"].items()
                                        if _I3_EXPECTED_INCOMPLETE.get(n) != v["reached"]}
    facts["holds"] = bool(facts["recorder_sees_every_site"] and facts["control_detected"] and
                          all(facts["mutants_detected"].values()) and
                          not facts["handle_requested_with_parallel_passes"] and
                          not facts["unexpectedly_incomplete"])
    return facts


PROBES["i3"] = probe_i3


def probe_no_optimizer():
    """What DeepSpeed 0.19.8 does with a config that names no optimizer (and none passed to
    initialize): per stage and dtype, whether initialize succeeds, the wrapper it builds, and what
    the first forward, backward and step raise, with the config and the file:line of the raise.
    zerocheck fails at the same call with the same words (Note [No optimizer] in engine/engine.cpp;
    tests/reference_test.cpp NoOptimizerFailsWhereDeepSpeedFails)."""
    facts = {}
    for name, stage, bf16, extra in (("stage0_f32", 0, False, {}), ("stage0_bf16", 0, True, {}),
                                     ("stage1", 1, False, {}), ("stage2", 2, False, {}),
                                     ("stage1_bf16_fp32_accum", 1, True, {"data_types": {"grad_accum_dtype": "fp32"}}),
                                     ("stage2_offload", 2, False, {"offload_optimizer": {"device": "cpu"}}),
                                     ("stage3", 3, False, {}), ("stage3_bf16", 3, True, {})):
        model = twin.SyntheticTwin([(3,), (5,)])
        config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
        if "offload_optimizer" in extra:
            config["zero_optimization"]["offload_optimizer"] = extra["offload_optimizer"]
        if "data_types" in extra:
            config["data_types"] = extra["data_types"]
        if bf16:
            config["bf16"] = {"enabled": True}
        fact = {"config": copy.deepcopy(config)}
        try:
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            fact["initialize"] = "ok"
            fact["optimizer"] = type(engine.optimizer).__name__
            dtype = torch.bfloat16 if bf16 else torch.float32
            batch = {"g0": torch.ones(2, 3, dtype=dtype), "g1": torch.ones(2, 5, dtype=dtype)}
            fact["failed_at"] = "forward"
            loss = engine(**batch)
            fact["failed_at"] = "backward"
            engine.backward(loss)
            fact["failed_at"] = "step"
            engine.step()
            fact["failed_at"] = None
        except Exception as e:  # noqa: BLE001 - the fact is which error, and where
            fact["error"] = f"{type(e).__name__}: {e}"
            frame = traceback.extract_tb(e.__traceback__)[-1]
            fact["raised_in"] = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
        facts[name] = fact
    return facts


PROBES["no_optimizer"] = probe_no_optimizer
