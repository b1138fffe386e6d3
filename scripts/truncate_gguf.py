"""Write a copy of a Llama-architecture GGUF that keeps only its bottom N transformer blocks.

    python scripts/truncate_gguf.py SRC.gguf DST.gguf --layers 12

Blocks are copied as they are stored (quantised blocks stay quantised, bit for bit), the token
embeddings, final norm and tokenizer metadata are kept, and ``<arch>.block_count`` is set to N.
A model loaded from the copy equals the source model truncated to N layers (``num_layers: N``).
Used by ``scripts/device_llm_layers.sh`` to train a depth range of SmolLM2 smaller than the whole model.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path


def truncate(src: Path, dst: Path, layers: int) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    count_key = f"{arch}.block_count"
    total = int(reader.fields[count_key].contents())
    if not 1 <= layers <= total:
        raise SystemExit(f"{src}: --layers must be in 1..{total} (the file has {total} blocks), got {layers}")
    blk = re.compile(r"^blk\.(\d+)\.")
    keep = [t for t in reader.tensors if not (m := blk.match(t.name)) or int(m.group(1)) < layers]
    tmp = dst.with_name(dst.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = layers if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    os.replace(tmp, dst)
    return {"blocks": layers, "of": total, "tensors": len(keep), "bytes": dst.stat().st_size}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--layers", type=int, required=True)
    args = ap.parse_args(argv)
    if not args.src.is_file():
        raise SystemExit(f"{args.src}: no such file")
    print(truncate(args.src, args.dst, args.layers), file=sys.stderr)


if __name__ == "__main__":
    main()
