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
