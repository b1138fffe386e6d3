"""GPU planner (``scalingnote scaling plan-gpu``): every formula against a hand-computed case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalingnote.cli import app
from scalingnote.errors import ScalingNoteError
from scalingnote.scaling.gpu_plan import ARCHITECTURES, GIB, GpuPlanSpec, flops_per_token_factor, plan_gpu

REPO = Path(__file__).resolve().parents[2]


def test_parameter_counts_match_the_published_models():
    # Qwen2.5-7B, by hand: attention 3584^2 + 2*3584*512 + 3584^2 + (3584 + 2*512) bias = 29,364,736;
    # SwiGLU 3*3584*18944 = 203,685,888; two RMSNorms 7,168 -> 233,057,792 per block; x28 + final norm.
    q7 = ARCHITECTURES["qwen2.5-7b"]
    assert q7.block_params == 233_057_792
    assert q7.non_embedding_params == 28 * 233_057_792 + 3584 == 6_525_621_760  # "6.53B non-embedding"
    # SmolLM2-135M: 576^2 + 2*576*192 + 576^2 + 3*576*1536 + 2*576 = 3,540,096 per block, 30 blocks,
    # tied 49152 x 576 embedding -> 134,515,008 in all ("135M")
    s = ARCHITECTURES["smollm2-135m"]
    assert s.block_params == 3_540_096
    assert s.total_params == 30 * 3_540_096 + 576 + 49152 * 576 == 134_515_008
    # LoRA r=8 on q and v of Qwen2.5-7B: 28 * 8 * ((3584 + 3584) + (3584 + 512))
    assert q7.lora_params(8, ["q_proj", "v_proj"]) == 28 * 8 * 11264 == 2_523_136
    with pytest.raises(ScalingNoteError, match="unknown to the GPU planner"):
        q7.lora_params(8, ["query"])


def test_flops_factor():
    assert flops_per_token_factor(False, False, False) == 6  # Eq. 14: 6N per trained token
    assert flops_per_token_factor(True, False, False) == 4  # no weight gradients for frozen weights
    assert flops_per_token_factor(False, True, True) == 10  # + no-grad forward (grad cache) + recompute
    assert flops_per_token_factor(True, True, True) == 8


def test_reduces_to_the_papers_eq14_and_eq15():
    # Fang et al. §6 setting: 10,000 steps x batch 256, query 30 + 2 x 60 passage tokens, A100 312 TFLOP/s
    # at 25%, $3.93/h -> Eq. 14: 10000*150*256*6 * 3.93 / (312e12*3600*0.25) = 3.2246e-8 $ per parameter.
    spec = GpuPlanSpec(
        arch="qwen2.5-1.5b",
        towers="dual",
        query_tokens=30,
        doc_tokens=60,
        global_batch=256,
        num_gpus=1,
        steps=10_000,
        activation_checkpointing=False,
        peak_flops=312e12,
        utilization=0.25,
        gpu_price_per_hour=3.93,
        corpus_size=1e6,
    )
    p = plan_gpu(spec)
    N = ARCHITECTURES["qwen2.5-1.5b"].non_embedding_params
    assert p["flops_per_token"] == "6N" and not p["gradient_cache"]
    assert p["train_dollars"] / N == pytest.approx(3.2246e-8, rel=1e-4)
    hours = 10_000 * 150 * 256 * 6 * N / (312e12 * 0.25) / 3600
    assert p["train_gpu_hours"] == pytest.approx(hours, rel=1e-12)
    # Eq. 15: encoding 1e6 documents x 60 tokens at 2N FLOPs per token
    assert p["encode_gpu_hours"] == pytest.approx(1e6 * 60 * 2 * N / (312e12 * 0.25) / 3600, rel=1e-12)
    # steps from data: ceil(1 epoch x 1000 pairs / 256) = 4
    assert plan_gpu(GpuPlanSpec(arch="qwen2.5-1.5b", global_batch=256, num_gpus=1, train_pairs=1000)).get("steps") == 4


def test_memory_hand_computed():
    s = ARCHITECTURES["smollm2-135m"]
    P, h, L = s.total_params, s.hidden_size, s.num_layers
    common = dict(
        arch="smollm2-135m",
        towers="dual",
        query_tokens=16,
        doc_tokens=32,
        global_batch=8,
        num_gpus=2,
        steps=1,
        activation_checkpointing=False,
        overhead_gib=0.0,
    )
    ddp = plan_gpu(GpuPlanSpec(sharding="ddp", **common))
    fsdp = plan_gpu(GpuPlanSpec(sharding="fsdp", **common))
    # fp32 params 4 B + fp32 grads 4 B + AdamW moments 8 B per parameter, two towers; FSDP divides by 2 GPUs
    assert ddp["mem_model_states_gib"] * GIB == pytest.approx(2 * 16 * P)
    assert fsdp["mem_model_states_gib"] * GIB == pytest.approx(2 * 16 * P / 2)
    # FSDP working set: bf16 root (embeddings + final norm) + 2 blocks, per tower
    assert fsdp["mem_fsdp_working_gib"] * GIB == pytest.approx(2 * 2 * (49152 * 576 + 576 + 2 * s.block_params))
    assert ddp["mem_fsdp_working_gib"] == 0
    # activations without checkpointing, local batch 4: 34 * tokens * h * L for 4x16 query and 2x4x32 document tokens
    acts = 34 * h * L * (4 * 16 + 2 * 4 * 32)
    assert ddp["mem_activations_gib"] * GIB == pytest.approx(acts)
    # with checkpointing: 2 B per kept layer input + one layer's full activations
    ck = plan_gpu(GpuPlanSpec(sharding="fsdp", **{**common, "activation_checkpointing": True}))
    t_q, t_d = 4 * 16, 2 * 4 * 32
    assert ck["mem_activations_gib"] * GIB == pytest.approx(sum(L * 2 * t * h + 34 * t * h for t in (t_q, t_d)))
    assert ddp["mem_per_gpu_gib"] == pytest.approx(ddp["mem_model_states_gib"] + ddp["mem_activations_gib"])
    # LoRA: frozen fp32 base + adapters with their grads and moments
    lora = plan_gpu(GpuPlanSpec(sharding="ddp", lora_r=4, lora_targets=["q_proj"], **common))
    T = L * 4 * (576 + 576)
    assert lora["trainable_params_per_tower"] == T
    assert lora["mem_model_states_gib"] * GIB == pytest.approx(2 * (4 * (P + T) + 12 * T))
    # gradient caching: the micro-batch sets the activations, not the local batch
    gc = plan_gpu(GpuPlanSpec(sharding="ddp", micro_batch=1, **common))
    assert gc["gradient_cache"] and gc["mem_activations_gib"] * GIB == pytest.approx(34 * h * L * (16 + 2 * 32))


def test_bad_specs_are_clear_errors():
    with pytest.raises(ScalingNoteError, match="unknown arch"):
        GpuPlanSpec(arch="gpt-5", steps=1)
    with pytest.raises(ScalingNoteError, match="divisible"):
        GpuPlanSpec(global_batch=10, num_gpus=4, steps=1)
    with pytest.raises(ScalingNoteError, match="steps or train_pairs"):
        GpuPlanSpec()


@pytest.mark.parametrize(
    "cfg,arch",
    [("stage1_qwen2.5_1.5b_fsdp_full.yaml", "qwen2.5-1.5b"), ("stage1_qwen2.5_7b_fsdp_lora.yaml", "qwen2.5-7b")],
)
def test_cli_plans_the_gpu_configs(cfg, arch):
    res = CliRunner().invoke(
        app,
        [
            "scaling",
            "plan-gpu",
            "--arch",
            arch,
            "--config",
            str(REPO / "configs" / "gpu" / cfg),
            "--train-pairs",
            "1e6",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    spec = plan["spec"]
    assert (
        spec["global_batch"] == 480 and spec["sharding"] == "fsdp" and spec["activation_checkpointing"]
    )  # Table 7 batch
    assert plan["gradient_cache"] and plan["local_batch"] == 60 and plan["steps"] == 2084  # ceil(1e6 / 480)
    assert plan["fits"] and 0 < plan["mem_per_gpu_gib"] < 80
