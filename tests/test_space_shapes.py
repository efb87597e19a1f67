"""``gpu_check``'s Space shapes (ears_core/gpu_check/space_shapes.py): the configurations are Qwen2.5-7B-Instruct's
and Qwen2.5-0.5B-Instruct's (their published parameter counts, biases, heads), the static pass takes them (so a GPU
captures them), the bytes a step reads leave out only an untied input table, and the CPU form of the check measures
and reports what the GPU form will: the round's cost made of the curve it measured, alone with ``--space-shapes``."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2ForCausalLM

from ears_core.gpu_check import main, space_shapes
from ears_core.gpu_check.space_shapes import SPACE_CPU, SPACE_GPU, space_pair, weight_bytes
from ears_core.model.passes.static_decoder import supports

CPU = torch.device("cpu")


@pytest.mark.parametrize("shape, params", [(SPACE_GPU.target, 7_615_616_512), (SPACE_GPU.draft, 494_032_768)])
def test_the_gpu_shapes_are_the_published_models(shape, params):
    with torch.device("meta"):
        model = Qwen2ForCausalLM(shape.config())
    assert sum(p.numel() for p in model.parameters()) == params  # the Hub's counts for the two checkpoints
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None and attn.head_dim == shape.hidden // shape.heads
    assert model.config.get_text_config().rope_parameters["rope_theta"] == 1e6
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == shape.tied
    assert shape.vocab > SPACE_GPU.tokens  # padded past the tokenizer's ids, as the real heads are
    total, step = weight_bytes(model.to(torch.bfloat16))
    assert total == 2 * params and total - step == (0 if shape.tied else 2 * shape.vocab * shape.hidden)


def test_the_static_pass_runs_both_models_so_a_gpu_captures_them():
    pair, _ = space_pair(CPU, SPACE_CPU, torch.float32)
    assert supports(pair.target) is None and supports(pair.draft) is None


def test_a_step_reads_every_weight_but_an_untied_input_table():
    pair, built = space_pair(CPU, SPACE_CPU, torch.float32)
    total, step = weight_bytes(pair.target)
    embed = SPACE_CPU.target.vocab * SPACE_CPU.target.hidden * 4
    assert (total, step) == (built["target_bytes"], built["target_step_bytes"]) and total - step == embed
    assert weight_bytes(pair.draft)[0] == weight_bytes(pair.draft)[1]  # tied: the table is the head, read whole
    assert pair.vocab_size == SPACE_CPU.tokens and pair.encode("t5 t7 unknown", chat=False).tolist() == [[5, 7, 0]]


def test_the_cpu_form_reports_what_the_gpu_form_will():
    check = space_shapes.check_space_shapes(CPU, repeats=1)
    f = check.figures
    assert check.status == "pass" and len(f["steps"]) == 16 and f["steps"][0] == 1.0
    assert f["chain_round_steps"] == pytest.approx(4 * f["draft_ms"] / f["step_ms"] + f["steps"][4], abs=0.01)
    assert f["read_ms"] == pytest.approx(f["target_step_bytes"] / f["device_gb_s"] / 1e6, abs=6e-4)
    assert f["read_goal_met"] == (f["step_ms"] <= space_shapes.READ_GOAL * f["read_ms"])
    assert 0 < f["cold_request"]["warm_up_s"] <= f["cold_request"]["first_token_s"]
    assert f["target_params"] == 1_189_504 and "small Qwen2 shapes" in check.detail


def test_space_shapes_alone_from_the_command_line(tmp_path, capsys):
    assert main(["--device", "cpu", "--space-shapes", "--json", str(tmp_path / "r.json")]) == 0
    body = json.loads((tmp_path / "r.json").read_text())
    assert [c["name"] for c in body["checks"]] == ["Space shapes"] and body["complete"] is True
