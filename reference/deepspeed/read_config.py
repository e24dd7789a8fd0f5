"""Reads ds_config files exactly as DeepSpeed's DeepSpeedConfig does (runtime/config.py: hjson.load
with dict_raise_error_on_duplicate_keys) and prints, as one JSON object, each file's value or why
DeepSpeed's reader refused it, into OUT (DeepSpeed logs on stdout):
{path: {"value": ...} | {"refused": "TypeName: message"}}.

zerocheck's reader (engine/hjson.cpp, Note [DeepSpeed's hjson]) is checked against this output.

    python read_config.py OUT FILE...
"""
import json
import sys

import hjson
from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys


def read(path):
    try:
        with open(path, "r") as f:  # as DeepSpeedConfig opens it: text mode, universal newlines
            return {"value": hjson.load(f, object_pairs_hook=dict_raise_error_on_duplicate_keys)}
    except Exception as e:  # what DeepSpeed would raise at initialize()
        return {"refused": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    with open(sys.argv[1], "w") as out:
        json.dump({p: read(p) for p in sys.argv[2:]}, out, allow_nan=False)
