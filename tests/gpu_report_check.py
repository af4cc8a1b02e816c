#!/usr/bin/env python3
"""bench/gpu_report.py on made-up results (ctest gpu_report; no GPU, no PyTorch): the
sides join by name, the ratio is PyTorch time / dtensor time, goals are judged, and a
case one side lacks says why.

    python3 tests/gpu_report_check.py [bench/gpu_report.py]
"""
import json
import os
import subprocess
import sys
import tempfile

REPORT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "bench", "gpu_report.py")


def iteration(name, t, unit="ms", **kw):
    return dict(name=name, run_type="iteration", real_time=t, time_unit=unit, **kw)


BENCH = {"context": {"executable": "bin/bench_cuda"}, "benchmarks": [
    iteration("BM_dtensor_matmul_fp32_vs_torch/4096/manual_time", 3.0e6, "ns", label="gemm_fp32_4096"),
    iteration("BM_dtensor_matmul_tf32_vs_torch/4096/manual_time", 1000, "us", label="gemm_tf32_4096"),
    iteration("BM_dtensor_matmul_bf16_vs_torch/4096/manual_time", 0.5, label="gemm_bf16_4096"),
    iteration("BM_dtensor_conv_gpu/0/0/1/manual_time", 2.0, label="conv3x3_n32_c64_56_k64_fp32_fwdbwd"),
    iteration("BM_copy_d2d_gpu/16777216/manual_time", 10.0, "us", label="copy_16MiB", bytes_per_second=1.6e12),
    iteration("BM_dtensor_cg_gpu/256/manual_time", 1.5, label="solver_cg_256", bytes_per_second=2.4e12),
    iteration("BM_dtensor_vcycle_gpu/256/manual_time", 5.0, label="solver_vcycle_256", bytes_per_second=1.6e12),
    iteration("BM_dtensor_step_cnn_gpu/manual_time", 2.0, label="step_cnn"),
    iteration("BM_dtensor_fft_gpu/256/0/manual_time", 2.0, label="fft_r2c_c2r_fp32_256"),
    iteration("BM_memcpy_gather_gpu/16777216/real_time/threads:2", 20.0, "us"),
    iteration("BM_dtensor_gather_gpu/16777216/real_time/threads:2", 21.0, "us"),
    iteration("BM_dtensor_gather_pipelined_gpu/16777216/real_time/threads:2", 25.0, "us"),
    dict(iteration("BM_dtensor_matmul_fp32_vs_torch/4096/manual_time_mean", 1.0), run_type="aggregate"),
]}
ATTENTION = {"context": {}, "benchmarks": [
    iteration("BM_fused_attention_bf16/1024/64/1/1/real_time", 0.5),
    iteration("BM_fused_attention_staged/1024/64/1/1/real_time", 1.0),
    dict(iteration("BM_fused_attention_bf16/4096/64/0/0/real_time", 0.0), error_occurred=True,
         error_message="cuDNN declined: no engine"),
]}
TORCH = {"meta": {"torch": "2.11", "device": "GPU X", "timing": "median"}, "records": [
    dict(name="gemm_fp32_4096", group="gemm", ms=3.0, flops=2 * 4096 ** 3),
    dict(name="gemm_tf32_4096", group="gemm", ms=0.8, flops=2 * 4096 ** 3),
    dict(name="gemm_bf16_4096", group="gemm", ms=0.4, flops=2 * 4096 ** 3),
    dict(name="conv3x3_n32_c64_56_k64_fp32_fwdbwd", group="conv", ms=1.0, flops=1e10),
    dict(name="conv3x3_n32_c64_56_k64_bf16cl_fwdbwd", group="conv", ms=0.3, flops=1e10),
    dict(name="attn_L1024_d64_causal_fwdbwd", group="attn", ms=0.5, flops=1e10),
    dict(name="attn_L4096_d64_full_fwd", group="attn", ms=0.5, flops=1e10),
    dict(name="copy_16MiB", group="copy", ms=0.01, bytes=16 << 20),
    dict(name="fft_r2c_c2r_fp32_256", group="fft", ms=1.9, flops=1e10),
    dict(name="fft_r2c_c2r_fp64_256", group="fft", ms=4.0, flops=1e10),
    dict(name="step_cnn_eager", group="step", ms=2.1),
    dict(name="step_cnn_compiled", group="step", skipped="over 60 s"),
    dict(name="step_gpt_eager", group="step", ms=3.0),
]}


def main():
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for name, doc in (("bench_cuda", BENCH), ("attention", ATTENTION), ("torch", TORCH)):
            paths[name] = os.path.join(d, name + ".json")
            with open(paths[name], "w") as f:
                json.dump(doc, f)
        out = os.path.join(d, "compare.md")
        subprocess.run([sys.executable, REPORT, "--bench", paths["bench_cuda"], "--bench", paths["attention"],
                        "--torch", paths["torch"], "--out", out], check=True)
        with open(os.path.join(d, "compare.json")) as f:
            rows = {r["case"]: r for r in json.load(f)["rows"]}
        with open(out) as f:
            md = f.read()
    fails = []

    def expect(cond, what):
        if not cond:
            fails.append(what)

    r = rows["gemm_fp32_4096"]
    expect(abs(r["ratio"] - 1.0) < 1e-9 and r["met"] is True, f"gemm fp32 ratio 1.0, met: {r}")
    r = rows["gemm_tf32_4096"]
    expect(abs(r["ratio"] - 0.8) < 1e-9 and r["met"] is False, f"gemm tf32 ratio 0.8 (us -> ms), not met: {r}")
    r = rows["gemm_bf16_4096"]
    expect(abs(r["ratio"] - 0.8) < 1e-9 and r["met"] is False, f"gemm bf16 ratio 0.8, not met: {r}")
    r = rows["conv3x3_n32_c64_56_k64_bf16cl_fwdbwd"]
    expect(r["goal"] == "-" and "channels-last" in r.get("why", ""), f"channels-last bf16: reference only: {r}")
    expect(rows["conv3x3_n32_c64_56_k64_fp32_fwdbwd"]["met"] is False, "conv ratio 0.5: not met")
    r = rows["attn_L1024_d64_causal_fwdbwd"]
    expect(abs(r["ratio"] - 1.0) < 1e-9 and r["goal"].startswith(">= 0.8"), f"attention joined by name: {r}")
    r = rows["attn_L1024_d64_causal_fwdbwd_staged"]
    expect(abs(r["ratio"] - 0.5) < 1e-9 and r.get("met") is None, f"staged row: reference, no goal: {r}")
    expect("cuDNN declined" in rows["attn_L4096_d64_full_fwd"]["why"], "a benchmark's error is why")
    expect(rows["copy_16MiB"].get("met") is None, "copy: a baseline, no goal")
    r = rows["fft_r2c_c2r_fp32_256"]
    expect(abs(r["ratio"] - 0.95) < 1e-9 and r["met"] is True, f"fft joined by its label, 0.95 >= 0.9: met: {r}")
    expect(rows["fft_r2c_c2r_fp64_256"].get("dtensor_ms") is None, "fft fp64: dtensor side missing")
    r = rows["step_cnn_eager"]
    expect(abs(r["ratio"] - 1.05) < 1e-9 and r["met"] is True, f"cnn step joined with eager: {r}")
    expect("no GPU training-step" in rows["step_gpt_eager"]["why"], "gpt step: dtensor side missing")
    expect("PyTorch skipped it" in rows["step_cnn_compiled"]["why"], "compiled step skipped")
    r = rows["gather_16MiB"]
    expect(abs(r["ratio"] - 20 / 21) < 1e-9 and r["met"] is True, f"gather: copies / dtensor, 1.05x: met: {r}")
    r = rows.get("gather_back_to_back_16MiB", {})
    expect(abs(r.get("ratio", 0) - 20 / 25) < 1e-9 and r.get("met") is False,
           f"gather issued back to back: its own row, 1.25x the copies: not met: {r}")
    r = rows["solver_cg_256"]
    expect(abs(r["ratio"] - 0.75) < 1e-9 and r["met"] is True, f"CG: traffic / the copy's (2 x 1.6e12): met: {r}")
    r = rows["solver_vcycle_256"]
    expect(abs(r["ratio"] - 0.5) < 1e-9 and r["met"] is False, f"V-cycle at half the copy's traffic: not met: {r}")
    expect("above 1, dtensor is faster" in md, "the header says which way the ratio goes")
    expect("gemm_fp32_4096_mean" not in md, "aggregates left out")
    for f in fails:
        print("FAILED:", f)
    print(f"gpu_report_check: {len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
