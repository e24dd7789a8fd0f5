"""The record format zerocheck reads (props/reference_record.cpp): a magic line, then entries, each
u32 name length, the name (UTF-8), u64 count and count little-endian f64 values. Every value the
reference records (bf16, fp32 or a count) is exact in f64, so comparing f64 bits compares the
tensors bit for bit."""
import struct

MAGIC = b"ZCREC1\n"


def write(path, entries):
    """entries: a list of (name, list-or-tensor of numbers)."""
    with open(path + ".tmp", "wb") as f:
        f.write(MAGIC)
        for name, values in entries:
            if hasattr(values, "detach"):
                values = values.detach().to("cpu").double().flatten().tolist()
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)))
            f.write(raw)
            f.write(struct.pack("<Q", len(values)))
            f.write(struct.pack(f"<{len(values)}d", *values))
    import os
    os.replace(path + ".tmp", path)


def read_f64(path):
    import array
    a = array.array("d")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a.tolist()
