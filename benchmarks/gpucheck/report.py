"""The summary table printed at the end of gpu_check and saved next to its JSON."""

from __future__ import annotations


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _kernels(a: dict) -> list[str]:
    cases = a["cases"]
    bad = [c for c in cases if not c["ok"]]
    lines = [f"(a) kernels vs references: {len(cases) - len(bad)}/{len(cases)} cases within "
             f"tolerance ({a['seconds']:.0f} s)"]
    by_dtype: dict[str, float] = {}
    for c in cases:
        by_dtype[c["dtype"]] = max(by_dtype.get(c["dtype"], 0.0), c["max_err"])
    lines += [f"    worst error {d}: {e:.2e}" for d, e in by_dtype.items()]
    lines += [f"    FAIL {c['kernel']} {c['dtype']}: {c['max_err']:.2e} > {c['tol']:.0e}" for c in bad]
    if a.get("moe_decode"):
        lines += [f"    MoE layer decode step (a CUDA graph replay on a GPU; copy bandwidth "
                  f"{a['copy_bandwidth_GBps']:.0f} GB/s):",
                  "    | layer | weights | batch | expert MB read | us | GB/s | of copy | "
                  "graph == eager |", "    |---|---|---|---|---|---|---|---|"]
        lines += [f"    | {r['layer']} | {r['weights']} | {r['batch']} | "
                  f"{r['expert_bytes'] / 1e6:.1f} | {r['us']:.1f} | {r['GBps']:.0f} | "
                  f"{r['vs_copy']:.2f} | {r.get('graph_matches_eager', '-')} |"
                  for r in a["moe_decode"]]
    return lines


def _parity(b: dict) -> list[str]:
    lines = [f"(b) greedy parity vs transformers ({b['model']}, {b['prompts']} prompts x "
             f"{b['new_tokens']} tokens)"]
    for dt in ("float32", "bfloat16"):
        r = b.get(dt)
        if r:
            lines.append(f"    {dt}: identical={r['identical']} agreement={r['agreement']:.1%} "
                         f"first divergence={r['first_divergence']} backend={r['backend']} "
                         f"graphs={r['cuda_graphs']}")
    return lines


def _decode(c: dict) -> list[str]:
    lines = [f"(c) decode step vs floor (copy bandwidth {c['bandwidth_GBps']:.0f} GB/s)",
             "    | batch | context | step ms | serial loop ms | graph replay ms | floor ms "
             "| step/floor | replay/floor | tok/s |",
             "    |---|---|---|---|---|---|---|---|---|"]
    for r in c["rows"]:
        lines.append(f"    | {r['batch']} | {r['context']} | {r['step_ms']:.2f} | "
                     f"{_fmt(r['serial_step_ms'])} | "
                     f"{_fmt(r['graph_replay_ms'])} | {r['floor_ms']:.2f} | "
                     f"{r['step_vs_floor']:.2f} | {_fmt(r['replay_vs_floor'])} | "
                     f"{r['tokens_per_s']:.0f} |")
    return lines


def _throughput(d: dict) -> list[str]:
    e, h, cmp_ = d["engine"], d.get("transformers", {}), d.get("comparison", {})
    lines = [f"(d) throughput, {d['requests']} requests x {d['prompt_len']} prompt / "
             f"{d['output_len']} output tokens{' (scaled down)' if d.get('scaled') else ''}",
             f"    engine: {e['tokens_per_s']:.0f} tok/s ({e['output_tokens']} tokens in "
             f"{e['seconds']:.1f} s, complete={e['complete']}, preemptions={e['preemptions']})",
             f"    engine TTFT p50/p99: {_fmt(e['ttft_ms']['p50'], '.0f')}/"
             f"{_fmt(e['ttft_ms']['p99'], '.0f')} ms, ITL p50/p99: "
             f"{_fmt(e['itl_ms']['p50'], '.1f')}/{_fmt(e['itl_ms']['p99'], '.1f')} ms"]
    if "tokens_per_s" in h:
        lines.append(f"    transformers generate_batch: {h['tokens_per_s']:.0f} tok/s "
                     f"({h['seconds']:.1f} s, including its warm-up)")
    elif "tokens_per_s_at_most" in h:
        lines.append(f"    transformers generate_batch: unfinished after {h['seconds']:.0f} s: "
                     f"at most {h['tokens_per_s_at_most']:.0f} tok/s")
    elif "error" in h:
        lines.append(f"    transformers generate_batch failed: {h['error']}")
    if cmp_.get("ratio") is not None:
        lines.append(f"    engine / transformers: {cmp_['bound']} {cmp_['ratio']:.2f}x")
    return lines


def _tiers(f: dict) -> list[str]:
    host = f.get("host") or {}
    return [f"(f) KV tiers below the pool ({f['model']}, {f['prompts']} prompts x "
            f"{f['prompt_tokens']} + {f['new_tokens']} tokens, pool {f['pool_bytes'] / 2**20:.1f} MiB)",
            f"    greedy identical with and without tiers: {f['identical']}; preemptions "
            f"{f['preemptions_without_tiers']} / {f['preemptions_with_tiers']}",
            f"    prompt tokens computed without / with tiers: "
            f"{f['prompt_tokens_computed_without']:,} / {f['prompt_tokens_computed_with']:,} "
            f"({f['tier_hit_tokens']:,} copied back); host tier pinned={host.get('pinned')}",
            f"    one prefix: computed {f['prefix_computed_s'] * 1000:.1f} ms, copied back from "
            f"RAM ({f['blocks_from_ram']} blocks) {f['prefix_from_ram_s'] * 1000:.1f} ms"]


def _vision(v: dict) -> list[str]:
    lines = [f"(v) images: greedy parity vs transformers ({v['model']}, {v['prompts']} prompts "
             f"batched x {v['new_tokens']} tokens; the image changes the answer: "
             f"{v['images_change_the_answer']}; default backend {v['default_backend']})"]
    for name, r in v["backends"].items():
        if "refused" in r:
            lines.append(f"    {name}: REFUSES images: {r['refused']}")
            continue
        lines.append(f"    {name}: identical={r['identical']} agreement={r['agreement']:.1%} "
                     f"first divergence={r['first_divergence']}")
        if "note" in r:
            lines.append(f"    FAIL {r['note']}")
    return lines


def _startup(e: dict) -> list[str]:
    ratio = e.get("pool_vs_plan")
    return ["(e) start-up lines:"] + [f"    {line}" for line in e["log"]] + [
        f"    max concurrency at 32k tokens: {e['max_concurrency_at_32k']:.2f}x",
        f"    KV pool vs `officellm plan --memory {e['plan_memory_bytes'] / 2**30:.1f}GiB`: "
        f"{e['kv_cache_tokens']:,} / {e['plan_pool_tokens']:,} tokens = "
        f"{_fmt(ratio, '.3f')} (target within 5 %)"]


def summary(report: dict) -> str:
    out = [f"officellm gpu_check on {report['meta']['device']} "
           f"({'smoke test, toy sizes' if report['meta']['smoke'] else 'full'})"]
    for key, fn in (("a_kernels", _kernels), ("b_parity", _parity), ("v_vision", _vision),
                    ("f_kv_tiers", _tiers),
                    ("e_startup", _startup),
                    ("c_decode", _decode), ("d_throughput", _throughput)):
        sec = report.get(key)
        if sec is None:
            continue
        if "skipped" in sec or "error" in sec:
            out.append(f"({key[0]}) {key[2:]}: {sec.get('skipped') or 'ERROR ' + sec['error']}")
            continue
        out += fn(sec)
    out.append(f"total {report['meta'].get('seconds', 0):.0f} s")
    return "\n".join(out)
