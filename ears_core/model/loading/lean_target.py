"""Build a ``LeanLlama`` (passes/lean_llama.py): from the embedded GGUF's own blocks, or from a float Llama.

Terms
-----
from the GGUF  every layer's seven linears keep their Q4_1 blocks (q and k un-permuted as transformers' loader
               does); the norms in bfloat16; the token embedding (Q8_0, tied to the output head) in bfloat16.
blocks file    ``lean/blocks.safetensors`` in the prepared folder: the GGUF tensors the lean target reads, raw,
               each one's GGUF type in the metadata: a memory map, where the GGUF parses its vocabulary first
               (3 s). In a subfolder: loaders that take a folder's ``*.safetensors`` (vLLM) never see it.
from floats    ``q4_1_blocks`` (kernels/int4_linear.py) quantises a float Llama's weights: any Llama runs lean.
supported      PyTorch's int4 kernel runs here with bfloat16 activations (AVX2, AVX512, AVX512-BF16, AMX; ARM as far
               as its kernel runs): tried on a tiny input, never read from CPU flags (kernels/cpu_forms.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ears_core.model.kernels import cpu_forms
from ears_core.model.kernels.gguf_q4 import pack_q4_1, q4_1_parts, q8_0_to_tensor, rotary_row_order
from ears_core.model.kernels.int4_linear import q4_1_blocks
from ears_core.model.passes.decoder import Layer
from ears_core.model.passes.lean_llama import LeanLlama

__all__ = ["BLOCKS_FILE", "SOURCE_KEY", "blocks_file", "blocks_path", "from_float_model", "from_gguf", "gguf_tensors", "supported"]

_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
BLOCKS_FILE = "lean/blocks.safetensors"  # under the prepared folder (module terms)
SOURCE_KEY = "gguf_bytes"  # the blocks file's metadata: the size of the GGUF it was made from
Tensors = dict[str, tuple[str, np.ndarray]]  # GGUF tensor name -> (its GGUF type name, its raw data)


def supported() -> bool:
    """Module terms: PyTorch's int4 kernel runs here on bfloat16 activations, tried (kernels/cpu_forms.py)."""
    return cpu_forms.int4_runs()


def _stack(parts: list[tuple[Tensor, Tensor, Tensor]]) -> Any:
    """Blocks of several matrices with the same inputs, stacked along the outputs, packed."""
    return pack_q4_1(*(torch.cat([p[i] for p in parts]) for i in range(3)))


def _layer(blocks: dict[str, tuple[Tensor, Tensor, Tensor]], attn_norm: Tensor, mlp_norm: Tensor) -> Layer:
    """One lean layer: norms (d,) bfloat16; q/k/v, o, gate/up and down as int4 weights."""
    return Layer(attn_norm.to(torch.bfloat16), _stack([blocks["attn_q"], blocks["attn_k"], blocks["attn_v"]]),
                     pack_q4_1(*blocks["attn_output"]), mlp_norm.to(torch.bfloat16),
                     _stack([blocks["ffn_gate"], blocks["ffn_up"]]), pack_q4_1(*blocks["ffn_down"]))


def gguf_tensors(path: str | Path) -> Tensors:
    """Every tensor of a GGUF file as (type name, raw data) (module terms), through the gguf package."""
    import gguf

    return {t.name: (t.tensor_type.name, t.data) for t in gguf.GGUFReader(str(path)).tensors}


def blocks_path(folder: str | Path) -> Path:
    """Where ``folder``'s blocks file is (module terms), made or not."""
    return Path(folder) / BLOCKS_FILE


def blocks_file(folder: str | Path, gguf: str | Path) -> Path:
    """``folder``'s blocks file made from ``gguf`` (module terms), written first where it is missing, damaged or
    was made from another file; written to a temporary sibling and renamed, so a reader never sees half of it."""
    from safetensors.numpy import save_file

    from ears_core.model.loading.damage import safetensors_metadata

    path, size = blocks_path(folder), str(Path(gguf).stat().st_size)
    try:
        if safetensors_metadata(path).get(SOURCE_KEY) == size:
            return path
    except (OSError, ValueError):  # missing or damaged: written again
        pass
    tensors = gguf_tensors(gguf)
    meta = {name: kind for name, (kind, _) in tensors.items()} | {SOURCE_KEY: size}
    path.parent.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        save_file({name: np.ascontiguousarray(data) for name, (_, data) in tensors.items()}, tmp, meta)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache may be shared (Docker, Space)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def from_gguf(path: str | Path, config: Any, attn_dtype: torch.dtype = torch.float64) -> LeanLlama:
    """The GGUF's Llama as a LeanLlama (module terms); ``config`` is its transformers config. ``path`` is the
    GGUF itself or a blocks file made from it."""
    from safetensors import safe_open

    path, text = Path(path), config.get_text_config()
    if path.suffix == ".safetensors":
        with safe_open(str(path), "np") as f:
            meta = f.metadata() or {}
            tensors = {name: (meta[name], f.get_tensor(name)) for name in f.keys()}
    else:
        tensors = gguf_tensors(path)

    def blocks(name: str, heads: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        kind, data = tensors[name]
        if kind != "Q4_1":
            raise ValueError(f"{name} is {kind}: the lean target reads Q4_1 layers only")
        codes, d, m = q4_1_parts(data)
        if heads is not None:
            order = rotary_row_order(codes.shape[0], heads)
            codes, d, m = codes[order], d[order], m[order]
        return codes, d, m

    def floats(name: str) -> Tensor:
        return torch.from_numpy(np.array(tensors[name][1])).float()

    layers = []
    for i in range(int(text.num_hidden_layers)):
        heads = {"attn_q": int(text.num_attention_heads), "attn_k": int(text.num_key_value_heads)}
        b = {name: blocks(f"blk.{i}.{name}.weight", heads.get(name)) for name in _LINEARS}
        layers.append(_layer(b, floats(f"blk.{i}.attn_norm.weight"), floats(f"blk.{i}.ffn_norm.weight")))
    kind, emb = tensors["token_embd.weight"]
    if kind != "Q8_0":
        raise ValueError(f"token_embd is {kind}: the lean target reads a Q8_0 embedding")
    if "output.weight" in tensors:
        raise ValueError("this GGUF has an untied output head: the lean target ties it to the embedding")
    return LeanLlama(config, layers, q8_0_to_tensor(emb), floats("output_norm.weight").to(torch.bfloat16),
                     attn_dtype)


def from_float_model(model: Any, attn_dtype: torch.dtype = torch.float64) -> LeanLlama:
    """A transformers Llama (tied embeddings) as a LeanLlama on Q4_1-style blocks of its weights; the
    model's own linears are set to those blocks dequantised, so both compute the same weights."""
    from ears_core.model.kernels.gguf_q4 import dequantize_q4_1

    layers = []
    with torch.no_grad():
        for block in model.model.layers:
            att, mlp = block.self_attn, block.mlp
            mods = {"attn_q": att.q_proj, "attn_k": att.k_proj, "attn_v": att.v_proj, "attn_output": att.o_proj,
                    "ffn_gate": mlp.gate_proj, "ffn_up": mlp.up_proj, "ffn_down": mlp.down_proj}
            b = {name: q4_1_blocks(mod.weight) for name, mod in mods.items()}
            for name, mod in mods.items():
                mod.weight.copy_(dequantize_q4_1(*b[name]).to(mod.weight.dtype))
            layers.append(_layer(b, block.input_layernorm.weight.float(), block.post_attention_layernorm.weight.float()))
        emb = model.get_input_embeddings().weight.detach().to(torch.bfloat16)
        norm = model.model.norm.weight.detach().to(torch.bfloat16)
    lean = LeanLlama(model.config, layers, emb.clone(), norm.clone(), attn_dtype)
    lean.generation_config = model.generation_config
    return lean
