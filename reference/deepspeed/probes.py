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
import pickle

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
        mod = importlib.import_module(site)
        fn = getattr(mod, "get_deepcompile_handle")
        saved["names"][site] = fn

        def counted(fn=fn, site=site):
            rec.requests.append(site)
            return fn()
        mod.get_deepcompile_handle = counted

    def restore():
        util.DeepCompileBuilder = saved["builder"]
        util.dc_handle = saved["dc_handle"]
        for site, fn in saved["names"].items():
            importlib.import_module(site).get_deepcompile_handle = fn
    return rec, restore


class AttentionTwin(torch.nn.Module):
    """A one-layer causal attention language model (embedding, q/k/v/o projections, SDPA, LM head,
    cross entropy): the smallest graph AutoSP's pass recognises (it shards the sequence of the
    input ids and labels and needs an SDPA node)."""

    def __init__(self, vocab=32, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.q_proj = torch.nn.Linear(dim, dim, bias=False)
        self.k_proj = torch.nn.Linear(dim, dim, bias=False)
        self.v_proj = torch.nn.Linear(dim, dim, bias=False)
        self.o_proj = torch.nn.Linear(dim, dim, bias=False)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, labels, position_ids=None):
        x = self.embed(input_ids)
        b, s, d = x.shape
        h = self.heads

        def split(t):
            return t.view(b, s, h, d // h).transpose(1, 2)

        a = torch.nn.functional.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)),
                                                             split(self.v_proj(x)), is_causal=True)
        y = self.o_proj(a.transpose(1, 2).reshape(b, s, d))
        logits = self.lm_head(y)
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def _i3_run(stage, passes):
    """One engine through compile, forward/backward, step and destroy; what the recorder saw."""
    import torch.distributed as tdist

    rec, restore = _install_recorder()
    out = {"stage": stage, "passes": passes}
    engine = None
    try:
        torch.manual_seed(0)
        model = AttentionTwin()
        config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.125}},
                  "zero_optimization": {"stage": stage},
                  "compile": {"deepcompile": True}}
        if passes:
            config["compile"]["passes"] = passes
        if "autotp" in passes:
            config["tensor_parallel"] = {"autotp_size": tdist.get_world_size()}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        try:
            engine.compile(backend="inductor")
            out["compiled"] = True
        except Exception as e:
            out["compiled"] = False
            out["compile_error"] = f"{type(e).__name__}: {e}"[:300]
        from deepspeed.compile.passes.sp_compile import prepare_autosp_inputs
        ids = torch.randint(0, 32, (1, 8))
        labels = torch.randint(0, 32, (1, 8))
        pos = torch.arange(8).unsqueeze(0)
        if "autosp" in passes:
            ids, labels, pos, _ = prepare_autosp_inputs(ids, labels, pos)
        try:
            loss = engine(input_ids=ids, labels=labels, position_ids=pos)
            engine.backward(loss)
            engine.step()
            out["trained"] = True
        except Exception as e:
            out["trained"] = False
            out["train_error"] = f"{type(e).__name__}: {e}"[:300]
    except Exception as e:
        out["setup_error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        if engine is not None:
            try:
                engine.destroy()
            except Exception as e:
                out["destroy_error"] = f"{type(e).__name__}: {e}"[:300]
        restore()
        torch._dynamo.reset()
    out["handle_requests"] = sorted(set(rec.requests))
    out["handle_loads"] = rec.loads
    out["handle_calls"] = sorted(set(rec.calls))
    out["handle_requested"] = bool(rec.requests or rec.loads)
    return out


def probe_i3():
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
    runs = [_i3_run(stage, [p]) for p in ("autosp", "autotp") for stage in (0, 1, 2, 3)]
    # Positive control: DeepCompile's own ZeRO-1 pass must request the handle on the same model.
    control = _i3_run(1, [])
    facts["runs"] = runs
    facts["control_z1_deepcompile"] = control
    facts["control_detected"] = control["handle_requested"]
    facts["handle_requested_with_parallel_passes"] = [f"stage {r['stage']} {r['passes'][0]}" for r in runs
                                                      if r["handle_requested"]]
    facts["compiled"] = [f"stage {r['stage']} {r['passes'][0]}" for r in runs if r.get("compiled")]
    facts["trained"] = [f"stage {r['stage']} {r['passes'][0]}" for r in runs if r.get("trained")]
    facts["holds"] = bool(facts["recorder_sees_every_site"] and facts["control_detected"] and
                          not facts["handle_requested_with_parallel_passes"])
    return facts


PROBES["i3"] = probe_i3
