"""The seeds' invariants stated on DeepSpeed alone, for any release or source tree (worker command
"probe" with the names seed_*). Each returns {"verdict": "holds" | "fails" | "not_applicable",
"summary": one line, ...evidence}. A verdict is what a user's calls do (backward, step, copy,
deepcopy, a read during a traced forward, compile and destroy), never whether a method or a line
exists; "not_applicable" names the API the release lacks, found by calling it.

The arithmetic is exact by construction (Note [Exact seed data]): a two-layer linear model with
small integer weights and inputs, SGD with lr 1/2, world and GA powers of two. Every gradient and
update is then exactly representable in fp32 whatever the association order, so the expected
parameters are computed here in plain torch and compared bit for bit: a dropped chunk, a stale
buffer or a double count moves some parameter by at least 1/2^k, never by a rounding error.

The probes share one scenario shape (the keyword arguments zerocheck's RapidCheck generator draws,
props/deepspeed_seeds.cpp): stage 0-3, offload (optimizer to CPU; stage 3 also params), ga 1-2,
n backward calls per micro-step 1-4, steps 1-3, contiguous and overlap flags, reduce bucket size,
and a data seed.
"""
import copy

import torch
import torch.distributed as dist

import deepspeed

LR = 0.5
DIMS = (3, 4, 2)  # in -> hidden -> out, bias-free linear layers
BATCH = 2


class LinearTwo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(DIMS[0], DIMS[1], bias=False)
        self.l2 = torch.nn.Linear(DIMS[1], DIMS[2], bias=False)

    def forward(self, x, y):
        return ((self.l2(self.l1(x)) * y).sum())


def _ints(gen, shape, lo=-2, hi=2):
    return torch.randint(lo, hi + 1, shape, generator=gen).to(torch.float32)


def _init(model, seed):
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(_ints(g, p.shape))


def _batch(seed, rank, step, micro, chunk):
    g = torch.Generator().manual_seed(hash((seed, rank, step, micro, chunk)) & 0x7fffffff)
    return _ints(g, (BATCH, DIMS[0])), _ints(g, (BATCH, DIMS[2]))


def _config(stage, offload, ga, contiguous, overlap, bucket):
    zero = {"stage": stage}
    if stage > 0:
        zero.update({"contiguous_gradients": bool(contiguous), "overlap_comm": bool(overlap),
                     "reduce_bucket_size": int(bucket)})
    if stage == 3:
        zero.update({"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": int(bucket)})
    if offload and stage > 0:
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": ga,
            "optimizer": {"type": "SGD", "params": {"lr": LR}}, "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False, "gradient_clipping": 0.0, "zero_optimization": zero}


def _full_params(engine, stage):
    """Every param in full, as a user reads it. At ZeRO-3 one GatheredParameters per param: releases
    up to 0.19.7 wait on the last of several params' all-gathers only (docs/findings.md, defect 9),
    and the worker makes that race read NaN every time (deferred_comm.py); the seeds' verdicts are
    about their own seeds, so they read the params one at a time, which that defect spares. A value
    that is still not finite is memory nothing wrote: an error, not a verdict on the seed."""
    params = list(engine.module.parameters())
    if stage == 3:
        out = []
        for p in params:
            with deepspeed.zero.GatheredParameters([p]):
                out.append(p.detach().clone().float())
    else:
        out = [p.detach().clone().float() for p in params]
    for i, t in enumerate(out):
        if not bool(torch.isfinite(t).all()):
            raise RuntimeError(f"param {i} read back from DeepSpeed holds {t.flatten().tolist()[:4]}: "
                               f"memory nothing had written (every value of these cases is finite)")
    return out


def _expected(seed, world, ga, n, steps):
    """The parameters after `steps` SGD steps on the gradient of the summed loss (every rank's every
    chunk), divided by GA (DeepSpeed's scale_wrt_gas) and averaged over the world."""
    model = LinearTwo()
    _init(model, seed)
    for s in range(steps):
        model.zero_grad()
        total = 0
        for r in range(world):
            for m in range(ga):
                for c in range(n):
                    x, y = _batch(seed, r, s, m, c)
                    total = total + model(x, y)
        (total / (ga * world)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return [p.detach().clone() for p in model.parameters()]


class SetupError(Exception):
    """deepspeed.initialize refused the scenario: the release cannot run it (verdict not_runnable),
    which says nothing about the invariant."""


def _initialize(model, config):
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except Exception as e:  # noqa: BLE001
        raise SetupError(f"deepspeed.initialize refused the scenario: {_raised(e)}") from e
    return engine


def _not_runnable(e):
    return {"verdict": "not_runnable", "summary": str(e)}


def _drive(args, coalesce, msids=None):
    """One engine through `steps` optimizer steps of ga micro-steps of n backward calls each, the
    boundary explicit (set_gradient_accumulation_boundary before each backward, true on the last of
    the step) or, coalescing, the n calls inside engine.coalesce_grad_reduction(). Returns the full
    parameters after the last step."""
    stage, ga, n, steps = args["stage"], args["ga"], args["n"], args["steps"]
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = LinearTwo()
    _init(model, args["seed"])
    config = _config(stage, args["offload"], ga, args["contiguous"], args["overlap"], args["bucket"])
    engine = _initialize(model, config)
    try:
        for s in range(steps):
            for m in range(ga):
                def chunks():
                    for c in range(n):
                        if not coalesce:
                            engine.set_gradient_accumulation_boundary(m + 1 == ga and c + 1 == n)
                        x, y = _batch(args["seed"], rank, s, m, c)
                        engine.backward(engine(x, y))
                    if msids is not None and stage == 3:
                        msids.append(int(engine.optimizer.micro_step_id))  # the flush starts next
                if coalesce:
                    with engine.coalesce_grad_reduction():
                        chunks()
                else:
                    chunks()
                engine.step()
        return _full_params(engine, stage)
    finally:
        engine.destroy()


def _first_difference(got, want, reference="the summed loss's gradient"):
    names = ["l1.weight", "l2.weight"]
    for name, g, w in zip(names, got, want):
        diff = (g != w).nonzero()
        if len(diff):
            i = tuple(int(v) for v in diff[0])
            return f"{name}{list(i)} = {float(g[i])}, {reference} gives {float(w[i])}"
    return None


def _describe(args):
    off = " offload" if args["offload"] and args["stage"] > 0 else ""
    return (f"world {dist.get_world_size()} stage {args['stage']}{off} ga {args['ga']} n {args['n']} "
            f"steps {args['steps']} contiguous {int(args['contiguous'])} overlap {int(args['overlap'])} "
            f"bucket {args['bucket']} seed {args['seed']}")


def _raised(e):
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:300]


def _baseline(args):
    """One plain step (one backward, GA 1) of the same configuration: the seeds' invariants are about
    several backward calls, so a release that cannot train one step of this configuration on this
    torch is not runnable here, whatever the reason (it is reported with the error)."""
    try:
        _drive(dict(args, n=1, ga=1, steps=1), coalesce=False)
    except SetupError as e:
        return _not_runnable(e)
    except Exception as e:  # noqa: BLE001
        return {"verdict": "not_runnable",
                "summary": f"{_describe(dict(args, n=1, ga=1, steps=1))}: one plain training step raised {_raised(e)}"}
    return None


def seed_multi_backward(**args):
    """N engine.backward() calls per micro-step with the explicit boundary give the gradient of the
    summed loss (seed 001's base: DeepSpeed PR #7981 fixed ZeRO-1/2 offload dropping chunks 1..N-1)."""
    base = _baseline(args)
    if base:
        return base
    try:
        got = _drive(args, coalesce=False)
    except SetupError as e:
        return _not_runnable(e)
    except Exception as e:  # noqa: BLE001 - what the user's calls raise is the verdict's evidence
        return {"verdict": "fails", "summary": f"{_describe(args)}: raised {_raised(e)}"}
    diff = _first_difference(got, _expected(args["seed"], dist.get_world_size(), args["ga"], args["n"], args["steps"]))
    if diff:
        return {"verdict": "fails", "summary": f"{_describe(args)}: {diff}"}
    return {"verdict": "holds", "summary": _describe(args)}


def _coalesce_missing(stage):
    """The reason coalescing does not apply here, found by entering the context on a real engine."""
    model = LinearTwo()
    engine = _initialize(model, _config(stage, False, 1, True, False, 500000000))
    try:
        if not hasattr(engine, "coalesce_grad_reduction"):
            return "this DeepSpeed has no engine.coalesce_grad_reduction() (PR #7992 adds it)"
        try:
            with engine.coalesce_grad_reduction():
                pass
        except NotImplementedError as e:
            return f"DeepSpeed refuses it here by design: {_raised(e)}"
        return None
    finally:
        engine.destroy()


def _coalesce_preconditions(args):
    """I1's and I2's verdict before any comparison: not applicable where the release has no
    coalescing (or refuses it here), not runnable where one plain step of the case fails."""
    try:
        why = _coalesce_missing(args["stage"])
    except SetupError as e:
        return _not_runnable(e)
    if why:
        return {"verdict": "not_applicable", "summary": why}
    return _baseline(args)


def seed_i1(**args):
    """I1: n backward calls inside engine.coalesce_grad_reduction() give bit-identical parameters to
    the same n calls reduced per backward (seed 001, PR #7992's compatibility matrix)."""
    early = _coalesce_preconditions(args)
    if early:
        return early
    try:
        base = _drive(args, coalesce=False)
        coalesced = _drive(args, coalesce=True)
    except SetupError as e:
        return _not_runnable(e)
    except Exception as e:  # noqa: BLE001
        return {"verdict": "fails", "summary": f"{_describe(args)}: raised {_raised(e)}"}
    diff = _first_difference(coalesced, base, reference="per-backward reduction")
    if diff:
        return {"verdict": "fails", "summary": f"{_describe(args)}, coalesced: {diff}"}
    return {"verdict": "holds", "summary": _describe(args)}


def seed_i2(**args):
    """I2: at ZeRO-3, micro_step_id is 0 at every coalesced flush, over several steps (so the flush
    copies into the gradient partition instead of adding to last step's)."""
    args = dict(args, stage=3)
    early = _coalesce_preconditions(args)
    if early:
        return early
    msids = []
    try:
        _drive(args, coalesce=True, msids=msids)
    except SetupError as e:
        return _not_runnable(e)
    except Exception as e:  # noqa: BLE001
        return {"verdict": "fails", "summary": f"{_describe(args)}: raised {_raised(e)}"}
    bad = [(i, v) for i, v in enumerate(msids) if v != 0]
    if bad:
        return {"verdict": "fails", "msids": msids,
                "summary": f"{_describe(args)}: micro_step_id {bad[0][1]} at flush {bad[0][0] + 1} of {len(msids)}"}
    return {"verdict": "holds", "msids": msids, "summary": f"{_describe(args)}: micro_step_id 0 at all {len(msids)} flushes"}


class _FakeReader(torch.nn.Module):
    """A layer whose forward, run inside a ZeRO-3 engine's forward (so DeepSpeed has marked its
    _parameters as in forward), reads a parameter that is a fake tensor, as Dynamo's tracing holds
    in the module's dict."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(DIMS[0], DIMS[0], bias=False)
        self.seen = None

    def forward(self, x):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode() as mode:
            fake = torch.nn.Parameter(mode.from_tensor(torch.zeros(2, 2)))
        self._parameters["fake_weight"] = fake
        try:
            self.seen = self._parameters["fake_weight"] is fake
        except Exception as e:  # noqa: BLE001
            self.seen = _raised(e)
        finally:
            del self._parameters["fake_weight"]
        return self.inner(x)


def seed_i4(**args):
    """I4: copy.copy and copy.deepcopy of a ZeRO-3 module's _parameters keep its _parent_module (so a
    read through the copy works), and a read of a fake tensor during a traced forward does not ask
    it for ds_status (seed 002, PR #6527)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(_FakeReader(), torch.nn.Linear(DIMS[0], DIMS[2], bias=False))
    config = _config(3, args.get("offload", False), 1, True, False, 500000000)
    try:
        engine = _initialize(model, config)
    except SetupError as e:
        return _not_runnable(e)
    out = {}
    failures = []
    try:
        layer = engine.module[1]
        d = layer._parameters
        out["dict_type"] = type(d).__name__
        if getattr(d, "_parent_module", None) is not layer:
            return {"verdict": "not_applicable",
                    "summary": f"this DeepSpeed's ZeRO-3 does not give modules a parent-aware _parameters ({type(d).__name__})"}
        for how, fn in (("copy.copy", copy.copy), ("copy.deepcopy", copy.deepcopy)):
            try:
                c = fn(d)
                parent = getattr(c, "_parent_module", None)
                if parent is None:
                    failures.append(f"{how}(module._parameters) has _parent_module None")
                else:
                    c["weight"]  # a read through the copy, as Dynamo's copies are read
            except Exception as e:  # noqa: BLE001
                failures.append(f"{how}(module._parameters) raised {_raised(e)}")
        x = torch.ones(BATCH, DIMS[0])
        try:
            engine(x)
            seen = engine.module[0].seen
            if seen is not True:
                failures.append(f"reading a fake-tensor param during a ZeRO-3 forward: {seen}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"a ZeRO-3 forward reading a fake-tensor param raised {_raised(e)}")
    finally:
        engine.destroy()
    if failures:
        return {"verdict": "fails", "summary": "; ".join(failures), **out}
    return {"verdict": "holds", "summary": "copy and deepcopy keep _parent_module; the fake param is read without ds_status", **out}


def seed_i3(stage=0, passes="autosp", **_):
    """I3: with only a parallelization pass (AutoSP, AutoTP), no DeepCompile handle is requested or
    loaded through compile, forward, backward, step and destroy (seed 000)."""
    import importlib

    import probes

    try:
        importlib.import_module("deepspeed.compile.util")
    except ImportError as e:
        return {"verdict": "not_applicable", "summary": f"this DeepSpeed has no DeepCompile ({_raised(e)})"}
    needed = {"autosp": "deepspeed.compile.init_sp", "autotp": "deepspeed.compile.init_tp"}[passes]
    try:
        importlib.import_module(needed)
    except ImportError:
        return {"verdict": "not_applicable", "summary": f"this DeepSpeed has no {passes} compile pass ({needed} is missing)"}
    run = probes._i3_run(stage, [passes], steps=2)
    where = f"stage {stage} {passes}"
    if run["handle_requested"]:
        return {"verdict": "fails", "run": run,
                "summary": f"{where}: the DeepCompile handle was requested from {', '.join(run['handle_requests']) or '-'} "
                           f"and loaded {run['handle_loads']} time(s) (reached {run['reached']})"}
    if not (run.get("lifecycle_complete_before_destroy") and run.get("destroyed")):
        stopped = run.get("stopped", run.get("destroy_error", {}))
        return {"verdict": "fails", "run": run,
                "summary": f"{where}: the lifecycle stopped at {run['reached']}: {stopped.get('error', '?')} "
                           f"({stopped.get('deepspeed_frame', '-')})"}
    return {"verdict": "holds", "run": run, "summary": f"{where}: compile, 2 steps and destroy, no handle requested"}


PROBES = {"seed_multi_backward": seed_multi_backward, "seed_i1": seed_i1, "seed_i2": seed_i2,
          "seed_i3": seed_i3, "seed_i4": seed_i4}
