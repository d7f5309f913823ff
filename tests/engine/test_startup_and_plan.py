"""Start-up sizing lines, the refusal with its numbers, and `officellm plan`'s arithmetic."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from officellm.engine.kv_plan import (
    ALLOW_LONG_MAX_MODEL_LEN,
    KVCacheTooSmallError,
    check_max_model_len,
    format_plan,
    load_spec,
    make_plan,
    model_window,
    shipped_configs,
)
from officellm.engine.loading.model_spec import ModelSpec
from tests.engine.conftest import make_llm


@pytest.mark.parametrize("name,per_token,params_b", [
    ("Qwen2.5-7B-Instruct", 57_344, 7.62),
    ("Qwen3-8B", 147_456, 8.19),
    ("Llama-3.1-8B-Instruct", 131_072, 8.03),
    ("SmolLM2-135M-Instruct", 23_040, 0.135),
    # The models offices run in 2026 (their published parameter counts).
    ("gpt-oss-20b", 49_152, 20.91),
    ("gpt-oss-120b", 73_728, 116.83),
    ("Qwen3-30B-A3B", 98_304, 30.53),
    ("gemma-3-4b-it", 139_264, 3.88),
    ("gemma-3-12b-it", 393_216, 11.77),
    ("gemma-3-27b-it", 507_904, 27.01),
    ("phi-4", 204_800, 14.66),
    ("Phi-4-mini-instruct", 131_072, 3.84),
])
def test_plan_bytes_per_token_for_shipped_configs(name, per_token, params_b):
    spec, _ = load_spec(name)
    assert spec.kv_bytes_per_token(2) == per_token
    assert abs(spec.num_parameters() / 1e9 - params_b) < 0.01


def test_shipped_configs_include_the_required_models():
    assert {"Qwen2.5-7B-Instruct", "Qwen3-8B", "Llama-3.1-8B-Instruct",
            "SmolLM2-135M-Instruct", "gpt-oss-20b", "gpt-oss-120b", "Qwen3-30B-A3B",
            "gemma-3-4b-it", "gemma-3-12b-it", "gemma-3-27b-it", "phi-4",
            "Phi-4-mini-instruct"} <= set(shipped_configs())


def test_a_mixture_of_experts_reads_a_tenth_of_its_weights_per_token():
    spec, _ = load_spec("Qwen3-30B-A3B")  # 128 experts, 8 per token
    assert abs(spec.num_active_parameters() / 1e9 - 3.35) < 0.01


def test_gpt_oss_experts_are_planned_in_mxfp4_bits():
    spec, name = load_spec("gpt-oss-20b")
    plan = make_plan(spec, name, 80 * 1024**3, "bf16", 32768)
    # The published size: experts at 4.25 bits a weight, the rest in bf16.
    assert abs(plan.weight_bytes / 1024**3 - 12.82) < 0.01


def test_gemma3_27b_plan_counts_only_the_window_of_its_sliding_layers():
    spec, name = load_spec("gemma-3-27b-it")
    plan = make_plan(spec, name, 80 * 1024**3, "bf16", max_model_len=32768)
    assert plan.sliding_layers == 52 and plan.sliding_window == 1024
    # A 32k chat holds every block of its 10 global layers (one group), and of the 52
    # others (six groups of up to 10) the 64 blocks of a 1,024-token window each.
    blocks_full_length = 2048 * 7  # what it would hold if every layer kept every token
    assert plan.blocks_at_max_len == 2048 + 6 * 64
    assert plan.concurrency_at_max_len == pytest.approx(plan.num_blocks / (2048 + 6 * 64))
    assert plan.concurrency_at_max_len > 5 * plan.num_blocks / blocks_full_length
    text = format_plan(plan)
    assert "52 of 62 layers slide: they keep only the last 1,024 tokens" in text


def test_plan_cli_prints_a_table_of_the_chats_that_fit():
    out = subprocess.run(
        [sys.executable, "-m", "officellm.cli", "plan", "gpt-oss-20b", "gemma-3-27b-it",
         "--memory", "24GiB,80GiB"], capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[0] == "| model | weights | 24GiB: 8k | 24GiB: 32k | 80GiB: 8k | 80GiB: 32k |"
    assert rows[2].startswith("| gemma-3-27b-it | 50.3 GiB | — | — | ")  # 24 GiB: no room


def test_plan_cli_says_what_a_host_tier_of_ram_keeps_beside_the_pool():
    out = subprocess.run(
        [sys.executable, "-m", "officellm.cli", "plan", "Qwen2.5-7B-Instruct", "--memory",
         "24GiB", "--kv-offloading-size", "16"], capture_output=True, text=True,
        check=True).stdout
    # 16 GiB of 57,344-byte tokens in blocks of 16: 299,584 tokens, 74.9 chats of 4,000.
    assert ("Host tier: 16.00 GiB of RAM -> 299,584 more tokens of prefix cache (74.9 "
            "4,000-token chats)") in out


def test_plan_for_qwen25_7b_on_80gib():
    spec, name = load_spec("Qwen2.5-7B-Instruct")
    plan = make_plan(spec, name, 80 * 1024**3, "bf16", max_model_len=32768, avg_tokens=4000)
    assert plan.bytes_per_token == 57_344
    assert plan.weight_bytes == spec.num_parameters() * 2
    assert plan.pool_tokens == (80 * 1024**3 - plan.weight_bytes) // (57_344 * 16) * 16
    assert plan.concurrency_at_max_len == pytest.approx(plan.pool_tokens / 32768)


def test_plan_with_an_fp8_kv_cache_fits_twice_the_chats_of_bf16():
    spec, name = load_spec("Qwen2.5-7B-Instruct")
    bf16 = make_plan(spec, name, 80 * 1024**3, "bf16", 32768)
    fp8 = make_plan(spec, name, 80 * 1024**3, "bf16", 32768, kv_cache_dtype="fp8_e4m3")
    assert fp8.bytes_per_token == 28_672 and fp8.weight_bytes == bf16.weight_bytes
    assert fp8.pool_tokens == (80 * 1024**3 - fp8.weight_bytes) // (28_672 * 16) * 16
    assert fp8.concurrency_at_avg == pytest.approx(2 * bf16.concurrency_at_avg, rel=1e-3)


def test_plan_with_an_int8_kv_cache_counts_each_rows_scale():
    spec, name = load_spec("Qwen2.5-7B-Instruct")
    plan = make_plan(spec, name, 80 * 1024**3, "bf16", 32768, kv_cache_dtype="int8")
    assert plan.bytes_per_token == 2 * 28 * 4 * (128 + 4) == 29_568
    assert "(2 x layers x kv_heads x (head_dim x 1 B + a 4 B scale), int8)" in format_plan(plan)


def test_plan_cli_takes_the_kv_cache_dtype():
    out = subprocess.run(
        [sys.executable, "-m", "officellm.cli", "plan", "Qwen2.5-7B-Instruct", "--memory", "80GiB",
         "--kv-cache-dtype", "fp8_e4m3"], capture_output=True, text=True, check=True).stdout
    assert "KV cache per token: 28,672 bytes (2 x layers x kv_heads x head_dim x 1 B, fp8_e4m3)" in out


def test_plan_with_tensor_parallelism_divides_weights_and_kv_per_gpu():
    spec, name = load_spec("Qwen2.5-7B-Instruct")
    one = make_plan(spec, name, 80 * 1024**3, "bf16", 32768)
    tp2 = make_plan(spec, name, 80 * 1024**3, "bf16", 32768, tensor_parallel_size=2)
    assert tp2.bytes_per_token == 57_344 // 2  # 2 of the 4 KV heads per GPU
    norms = (spec.num_layers * 2 + 1) * spec.hidden_size * 2  # every GPU keeps them whole
    assert tp2.weight_bytes == (one.weight_bytes - norms) // 2 + norms
    assert tp2.pool_bytes == 80 * 1024**3 - tp2.weight_bytes
    assert tp2.pool_tokens > 2 * one.pool_tokens


def test_plan_counts_the_largest_share_of_an_uneven_split():
    spec, name = load_spec("SmolLM2-135M-Instruct")  # 3 KV heads: 1 and 2 per GPU
    tp2 = make_plan(spec, name, 8 * 1024**3, "bf16", tensor_parallel_size=2)
    assert tp2.bytes_per_token == spec.kv_bytes_per_token(2) * 2 // 3


def test_plan_refuses_a_split_the_engine_cannot_run():
    from officellm.engine.models.shard_plan import TensorParallelSplitError

    spec, name = load_spec("SmolLM2-135M-Instruct")  # 9 heads over 3 KV heads
    with pytest.raises(TensorParallelSplitError, match="across 4 ranks"):
        make_plan(spec, name, 8 * 1024**3, "bf16", tensor_parallel_size=4)


def test_plan_cli_prints_per_gpu_numbers_under_tensor_parallelism():
    out = subprocess.run(
        [sys.executable, "-m", "officellm.cli", "plan", "Qwen2.5-7B-Instruct", "--memory", "80GiB",
         "--max-model-len", "32768", "--tensor-parallel-size", "2"],
        capture_output=True, text=True, check=True).stdout
    assert "(tensor parallel 2)" in out and "KV cache per token: 28,672 bytes per GPU" in out
    assert "Weights: 7.09 GiB per GPU" in out


def test_plan_cli_prints_the_arithmetic():
    out = subprocess.run(
        [sys.executable, "-m", "officellm.cli", "plan", "Qwen2.5-7B-Instruct", "--memory", "80GiB",
         "--max-model-len", "32768"], capture_output=True, text=True, check=True).stdout
    assert "57,344" in out and "Maximum concurrency for 32,768 tokens per request" in out


def test_startup_logs_the_pool_in_vllm_wording(smollm2_dir, caplog):
    with caplog.at_level(logging.INFO):
        llm = make_llm(smollm2_dir, kv_cache_memory="64MiB", max_model_len=1024)
    text = caplog.text
    tokens = llm.llm_engine.engine_core.kv.pool.num_blocks * 16
    assert "Available KV cache memory: 0.06 GiB" in text
    assert f"KV cache size: {tokens:,} tokens ({tokens // 16:,} blocks of 16; 46,080 B/token)" in text
    assert f"Maximum concurrency for 1,024 tokens per request: {tokens / 1024:.2f}x" in text


def test_startup_logs_the_resident_memory_at_rest(smollm2_dir, caplog):
    with caplog.at_level(logging.INFO):
        make_llm(smollm2_dir, kv_cache_memory="64MiB", max_model_len=1024)
    line = next(r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Resident memory after load: "))
    rss_gib = float(line.split(": ")[1].split(" GiB")[0])
    # At least the float32 weights and the zero-filled pool. No upper bound here: this
    # process also holds the other tests' engines; compare_cpu.py keeps a lone server's line.
    assert rss_gib >= 0.5 + 0.06, line
    assert "(this process: 0.50 GiB of weights, 0.06 GiB of KV pool)" in line


def test_max_model_len_that_cannot_fit_is_refused_with_numbers(smollm2_dir):
    with pytest.raises(KVCacheTooSmallError) as exc:
        make_llm(smollm2_dir, kv_cache_memory="16MiB", max_model_len=8192)
    msg = str(exc.value)
    assert "8,192" in msg and "46,080 B/token" in msg and "0.35 GiB" in msg
    assert "largest max_model_len that fits is 352" in msg and "--kv-cache-memory" in msg


def test_without_max_model_len_the_largest_fitting_length_is_used(smollm2_dir, caplog):
    with caplog.at_level(logging.INFO):
        llm = make_llm(smollm2_dir, kv_cache_memory="16MiB")
    assert llm.llm_engine.max_model_len == 352
    assert "max_model_len set to 352" in caplog.text


def test_prompt_too_long_is_refused_in_vllm_wording(smollm2_dir):
    from officellm.engine import PromptTooLongError, SamplingParams

    llm = make_llm(smollm2_dir, kv_cache_memory="16MiB", max_model_len=128)
    with pytest.raises(PromptTooLongError, match=(
            "This model's maximum context length is 128 tokens. However, your request has 200 "
            "input tokens. Please reduce the length of the input messages.")):
        llm.llm_engine.add_request("long", list(range(10, 210)), SamplingParams())
    assert not llm.llm_engine.has_unfinished_requests()


def test_under_tensor_parallelism_the_pool_is_sized_by_the_smallest_rank(caplog):
    import torch

    from officellm.engine.config import EngineConfig
    from officellm.engine.distributed.parallel_state import ParallelState
    from officellm.engine.worker.worker import Worker

    class TwoRanks(ParallelState):
        """Rank 0 of two, whose rank 1 reports half rank 0's budget."""

        def all_gather_int(self, value: int) -> list[int]:
            return [value, value // 2]

        def broadcast_object(self, obj=None):
            return obj

    spec, _ = load_spec("SmolLM2-135M-Instruct")
    worker = object.__new__(Worker)  # the sizing alone: no model to load
    worker.config, worker.spec, worker.dtype = EngineConfig(), spec, torch.bfloat16
    worker.kv_dtype = torch.bfloat16
    worker.parallel = TwoRanks(0, 2)
    worker.kv_budget = lambda: (2 * 1024**3, "--gpu-memory-utilization")
    with caplog.at_level(logging.INFO):
        num_blocks, _ = worker.size_pool()
    assert num_blocks == 1024**3 // (spec.kv_bytes_per_token(2, 2) * 16)
    assert "Rank 0: available KV cache memory: 2.00 GiB" in caplog.text
    assert "Rank 1: available KV cache memory: 1.00 GiB" in caplog.text
    assert "KV cache pool per rank: the minimum over 2 ranks, 1.00 GiB" in caplog.text


def test_a_max_model_len_beyond_the_trained_window_is_refused_with_the_way_out(smollm2_dir,
                                                                             monkeypatch):
    monkeypatch.delenv(ALLOW_LONG_MAX_MODEL_LEN, raising=False)
    with pytest.raises(ValueError, match=f"--max-model-len 32,768 is beyond the 8,192 tokens "
                                         f".*{ALLOW_LONG_MAX_MODEL_LEN}=1"):
        make_llm(smollm2_dir, max_model_len=32768)


def test_the_long_window_is_served_when_the_operator_allows_it(monkeypatch):
    spec = ModelSpec.from_config_dict({"model_type": "llama", "num_hidden_layers": 2,
                                       "hidden_size": 64, "intermediate_size": 128,
                                       "num_attention_heads": 4, "vocab_size": 100,
                                       "max_position_embeddings": 8192})
    monkeypatch.setenv(ALLOW_LONG_MAX_MODEL_LEN, "1")
    check_max_model_len(spec, 32768)  # allowed, with a warning
    monkeypatch.setenv(ALLOW_LONG_MAX_MODEL_LEN, "0")
    with pytest.raises(ValueError, match="beyond the 8,192 tokens"):
        check_max_model_len(spec, 32768)
    check_max_model_len(spec, 8192)


def test_a_yarn_scaled_model_is_made_for_its_stretched_window():
    spec = ModelSpec.from_config_dict({"model_type": "qwen2", "num_hidden_layers": 2,
                                       "hidden_size": 64, "intermediate_size": 128,
                                       "num_attention_heads": 4, "vocab_size": 100,
                                       "max_position_embeddings": 32768,
                                       "rope_scaling": {"type": "yarn", "factor": 4.0}})
    assert model_window(spec) == 131072
    check_max_model_len(spec, 131072)
