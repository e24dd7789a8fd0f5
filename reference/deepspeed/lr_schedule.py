"""DeepSpeed's own WarmupLR / WarmupDecayLR learning rates, step by step, for the engine's
scheduled_lr to be compared with bit for bit (tests/lr_schedule_deepspeed_test.cpp).

usage: lr_schedule.py '{"type": "WarmupLR", "params": {...}, "lr": 0.001, "steps": 12}'
prints {"deepspeed": version, "lrs": [float.hex of the lr each applied step runs at]}.
The engine calls lr_scheduler.step() after every applied step (engine.py _take_model_step), so
step k runs at the lr the scheduler set after k steps; construction sets the first.
"""
import json
import sys

import deepspeed
import torch
from deepspeed.runtime import lr_schedules


def main():
    spec = json.loads(sys.argv[1])
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=spec["lr"])
    cls = {"WarmupLR": lr_schedules.WarmupLR, "WarmupDecayLR": lr_schedules.WarmupDecayLR}[spec["type"]]
    sched = cls(opt, **spec["params"])
    lrs = []
    for _ in range(spec["steps"]):
        lrs.append(float(opt.param_groups[0]["lr"]).hex())
        sched.step()
    print(json.dumps({"deepspeed": deepspeed.__version__, "lrs": lrs}))


if __name__ == "__main__":
    main()
