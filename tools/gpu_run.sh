#!/usr/bin/env bash
# One device call that checks and times what a change touches, so a 30-minute device budget goes
# into measurements rather than machine starts. Run on the GPU host from the repo root (after the
# device bundle's env.sh and `pip install -e .`); results go under $OUT.
#
#   bash tools/gpu_run.sh STEP [STEP ...]  in order; a device call may run 600 s at most:
#     tests_kernels  GPU tests of the kernels (compiles ~300 kernels: ~6 min, a call of its own)
#     tests_layer    ParallelMLP on cute vs the fp64 reference, recompute, main_grad, and
#                    the torch backend's CUDA paths (~1 min)
#     tests_defaults the default configs' GPU tests (test_ops_gpu -k default_big: pingpong and
#                    cooperative big GEMMs, stream-K and the long-K pingpong rule, tails in M, N, K,
#                    accumulate and act with recompute's bits) (~2 min)
#     tests_all      tests_kernels and tests_layer as 8 concurrent pytest shards (tools/pytest_shards.py):
#                    compiling is most of their time and the host has 16 cores
#     streamk        stream-K, the default where a GEMM's last wave is light: its GPU tests, then
#                    the long-K GEMMs (fc2, dx, dW2, dW1) held with it forced on beside the
#                    default, h=14336 and 7168 (~5 min)
#     streamk_fill   stream-K's GPU tests, then the wgrads that have fewer tiles than SMs (T=65536 at
#                    d=1024 h=1024 and d=2048 h=704) held with stream-K over the whole grid beside
#                    the default's whole tiles (~4 min)
#     configs_small  the GEMMs with few tiles (T=512 and 1000, the wgrads at T=65536 with d <= 2048),
#                    the default's config beside the ones it replaced and the next candidates
#                    (fc1 in 128x64 tiles, stream-K over 128x64 tiles at T=512);
#                    short GEMMs as CUDA graphs of 20 calls; first the GPU tests of those configs
#                    (stream-K over an under-filled grid, the 64-wide tile, 2x1 clusters over an
#                    odd number of tile rows) (~4 min)
#     configs_wave   the GEMMs that the fewer-waves rule (config.with_fewer_waves) moved to whole
#                    cooperative 128x192 tiles, beside the configs it replaced, and two it left in
#                    stream-K 128x256 beside 128x192; graphed, held 0.4 s x 4 (~6 min)
#     configs_mid    big GEMMs at K < 6144 (fc1, fc2 and dx at T=4096-16384 with d or h of 1024-5120),
#                    where cooperative 128x256 tiles run as few or fewer waves than the default's
#                    pingpong 128x128 or 128x192: the default beside cooperative 128x256, held
#                    0.5 s x 4 (~5 min)
#     configs_long_k the big GEMMs from K = 6144 that the columns rule (config.wave_columns) or
#                    LONG_K_COOPERATIVE_MIN_K decides, beside the other tile: fc2 and dx of
#                    T=16384 d=8192 swiglu and dx of T=8192 d=8192 h=5504 (K >= 10240,
#                    cooperative) beside pingpong 128x192; fc1, fc2 and dx of T=8192 d=8192 gelu
#                    h=8192 (K = 8192, pingpong) beside cooperative 128x256; then the T=16384 step
#                    with its pingpong GEMMs cooperative; held 0.4 s x 4 (~3 min)
#     configs_dact   the swiglu dact (dy @ W2 + dact) at K = 1024, 2048 and 4096 (T=8192 d=1024,
#                    T=65536 d=1024, T=8192 d=2048, T=65536 d=2048 h=704, T=8192 d=4096 h=1376 and
#                    h=14336):
#                    the default beside cooperative 128x128 1x1 and pingpong 128x192 2x1, the
#                    configs of the short-K dact rule (~3 min)
#     configs_swap   the gated dact's pair swap (GemmConfig.dact_pair_swap): its GPU tests (bitwise
#                    equal to the unswapped dact), then the swiglu dact at the configs_dact shapes,
#                    the default and cooperative 128x128, each with the swap and without, held
#                    0.5 s x 4 (~4 min: tests 74 s, the bench 146 s on 2026-12-03)
#     configs_ring   the dact's preact ring at cooperative 128x128: its GPU tests (dpreact in
#                    place over 3 and 4 slots equals the two-slot ring's bits), then the dact
#                    (dy @ W2 + dact) with 2, 3 and 4 slots at K = 1024 (the short-K rule's
#                    config), and 4 slots in 1x1 and 2x1 clusters beside the pingpong default at
#                    K = 2048 and 4096, swiglu and gelu_tanh_approx, held 0.4 s x 4 (~6 min)
#     configs_raster every GEMM of three GPU-bound steps (the headline, T=8192 d=8192 gelu h=8192,
#                    T=16384 d=8192 swiglu h=11008) in the default walk beside groups of 16 cluster
#                    columns and groups of 8 cluster rows, serpentine, for all (the raster rule,
#                    config.with_raster, and where rows might also win), held 0.5 s x 4 (~6 min)
#     configs_narrow_gelu  fc1 + act and the dact (and their plain GEMMs) of the narrow gelu shards
#                    T=8192 d=4096 h=2048 and T=16384 d=5120 h=2560 (0.79-0.91x cuBLAS on an H100)
#                    beside other tiles: pingpong 128x128 and 128x192, the dact cooperative
#                    128x256 and 128x128 with the short-K ring, 1x1 clusters; held 0.4 s x 4 (~3 min)
#     configs_narrow_ring  the same two shards' fc1 + act and dact at their default (cooperative
#                    128x256) beside 16-column subtiles and, for the dact, two and three preact
#                    subtiles loaded ahead instead of one; held 0.4 s x 4 (~2 min)
#     configs_narrow_n  the GEMMs the narrow whole-tiles rule moves (dW2 += at T=8192 and 16384,
#                    d=4096 swiglu h=1376; fc1 + act at T=4096 d=4096 h=688) in whole 128x128 tiles
#                    beside the stream-K 128x256 tiles they had, stream-K 128x128 and 128x160,
#                    and the same for a big GEMM the rule leaves alone whose 256-wide tiles pad N
#                    by 7.5% (dW2 of Qwen2.5-7B at TP8: T=8192 d=3584 h=2368, 3584 x 2368 x 8192),
#                    and fc1 + act in cooperative 128x256 (at h=1376 its waves tie pingpong 128x192's);
#                    held 0.4 s x 4, then the step at h=1376 beside eager and quack (~5 min)
#     configs_sk_pingpong  big GEMMs at K 4096-6143 whose pingpong 128x192 tiles leave the last wave
#                    light (fc1 at T=8192 d=4096 swiglu h=1376 and at T=2048-4096 of Llama 2 7B,
#                    Llama 3 8B and Llama 2 13B shards; fc2 and dx of Qwen2.5-7B at TP4 and TP8,
#                    T=4096) in pingpong 128x192 and in stream-K 128x256 tiles beside the default
#                    (the stream-K-over-pingpong rule takes the latter at two of them), held 0.4 s
#                    x 6; the GPU tests of the default at a tailed shape the rule applies to; then
#                    the step at h=1376 beside eager and quack (~5 min)
#     configs_below_bound  every GEMM of the three GPU-bound swiglu steps furthest below the GEMM
#                    bound on an H100 (T=8192 d=4096 h=2752 and h=5504, T=4096 d=5120 h=3456:
#                    0.939-0.950x the bound in the sweep) at the default beside stream-K 128x256
#                    and 128x128 tiles, held 0.4 s x 4 (~6 min)
#     configs_pairs  the big pingpong GEMMs of few rows in 2x1 clusters (config.PAIR_MIN_ROWS): their
#                    GPU tests (9 tile rows, tails in M, N and K), then fc1 and the dact of the two
#                    T=1000 steps in their default beside 1x1 clusters, held 0.4 s x 4; then the
#                    T=1000 steps beside eager, three turns (~3 min)
#     configs_one_wave  fc2 and dx where 128x256 tiles fill just under one wave (0.97 of the grid:
#                    T=512 d=8192 swiglu h=2752, T=2048 d=2048 swiglu h=2816, T=4096 d=1024 gelu
#                    h=4096, T=1000 d=4096 swiglu h=11008), which the default runs in whole 128x256
#                    tiles (config.ONE_WAVE_MIN_FILL), beside two waves of 128x128 in 1x1 clusters
#                    (the rule before it) and 128x256 in 1x1 and in 2x1 clusters (and the wgrads,
#                    alike at T=4096 d=1024); graphed where short, held 0.4 s x 4 (~4 min)
#     tests_overlap  (both overlap steps first run one dact test of each schedule, 2 min at most,
#                    and stop there if it fails or hangs: a hung kernel costs that, not the step)
#                    the GPU tests of the two schedules that let a tile's epilogue run beside more
#                    of the MMA: the cooperative 192x128 tile of three consumer warpgroups and the
#                    handoff schedule (two mainloop and two epilogue warpgroups, the accumulators
#                    through shared memory); every epilogue kind, the dact's preact rings,
#                    clusters, tails; bitwise equal to cooperative 128x128 (31 s on an H100)
#     configs_overlap  those two beside the default, held 0.4 s x 6 (x 4 at the headline): the
#                    dacts at K = 1024 (T=8192 and 65536 d=1024 swiglu, T=65536 d=1024 gelu
#                    h=1024; the small step T=4096 d=1024 gelu as CUDA graphs of 20), each with
#                    a 3-slot and a 4-slot preact ring; the dact at K = 2048 (T=8192 d=2048
#                    swiglu h=5632); fc1 + act and the dact of the narrow gelu shards T=8192
#                    d=4096 h=2048 and T=16384 d=5120 h=2560; every GEMM of the headline (309 s)
#     overlap_ab     whole fwd+bwd steps with the short-K dact (its config alone: dact_prefetch=3)
#                    on the handoff schedule and on the cooperative 192x128 tile, beside the rule
#                    and eager (tools/option_ab.py --where, held 0.4 s x 6) at T=8192 and 65536
#                    d=1024 swiglu and T=65536 d=1024 gelu h=1024 (72 s)
#     configs_sk160  the long-K dW2 += whose 256-wide tiles pad N (h shards of Llama 2 7B and
#                    13B, Qwen2.5-7B at TP8 and TP4; T=8192 and 16384): the default beside
#                    stream-K 128x160 (its B operand in a 64B swizzle), held 0.4 s x 6, the data a
#                    rule for 160-wide stream-K tiles needs (127 s)
#     tests_pdl      the GPU tests of programmatic dependent launch (GemmConfig.pdl, ops.set_pdl):
#                    every epilogue kind and schedule bitwise equal to its twin without it, a kernel
#                    reading the output of a one-CTA kernel still running and overwriting the
#                    operand it still reads, chains in CUDA graphs, the layer's step (~2 min)
#     pdl            pdl's worth: the fused step with it and without (tools/pdl_ab.py, held 0.4 s x
#                    6, nine shapes from T=512 to the headline) and each GEMM held beside its twin
#                    (bench configs --also pdl=1: the headline, and graphed T=512 d=1024 swiglu and
#                    T=4096 d=1024 gelu, where a kernel's launch and setup are a larger share) (~5 min)
#     short_k_probe  where the dact at K = 1024 (the short-K rule's cooperative 128x128) loses
#                    its time: on 66 and 100 SMs instead of 132 (a dact that gains on its plain
#                    GEMM with fewer SMs points at contention for HBM or L2 between SMs whose
#                    epilogues run at once; an even ratio, at a cost inside each SM: what it read
#                    on 2026-12-05), with its preact prefetched into L2 (with the 4-slot ring too)
#                    and in 16-column subtiles; plain dy@W2 in each config beside it; held
#                    0.4 s x 4 (~2 min)
#     plain_gemms    tools/plain_gemms.py: the four GEMMs of a step without an activation (fc2, dx,
#                    the wgrads bf16 and accumulated into fp32), ours against cuBLAS at the sweep's
#                    30 shapes, CUDA-graphed and held 0.2 s x 4; a JSON (~6 min, a call of its own)
#     plain_gemms_host the same at the host-bound shapes (T = 512, 2048, 4096), called from Python
#                    without graphs: each GEMM's launch host time included (~1.5 min)
#     gemm           the MLP's GEMMs and fused ops against cuBLAS, three configs (~5 min)
#     mlp            the whole MLP fwd+bwd against eager (no torch.compile, no cold start)
#     sweep          the shape sweep: 30 shapes, ours (backend='auto', the fused kernels timed
#                    beside it where it takes the small step) against eager, torch.compile and quack,
#                    its kernels compiled ahead; a JSON and heat maps (~8 min, a call of its own)
#     sweep_ceiling  the sweep with cuBLAS's six GEMMs of each step timed beside the variants
#                    (--ceiling: the bound of a fused MLP, ours against it) (~9 min, a call of
#                    its own)
#     sweep_plain_launches  the sweep with ours launching kernel by kernel (--no-launch-graphs:
#                    its launch groups never replayed from CUDA graphs, launch_graphs.py) (~8 min,
#                    a call of its own)
#     sweep_below_eager  the four shapes the sweeps have read below eager (the non-gated small
#                    steps and T=512 d=1024 swiglu), eight turns each instead of two, without
#                    quack and torch.compile (~3 min)
#     sweep_below_target  the headline beside the GEMM bound and the three GPU-bound shapes the
#                    H200 and H100 sweeps have read below quack or eager (T=4096 d=5120 swiglu
#                    h=3456, T=16384 d=8192 swiglu h=11008, T=16384 d=5120 gelu h=2560), six
#                    turns each, with quack, without torch.compile (~4 min)
#     sweep_heat     the sweep's first two shapes (the headline, T=8192 d=4096 swiglu h=11008) six
#                    turns each after 10 s of untimed calls instead of 1.5 (--heat-s 10): whether
#                    a longer heat makes their first rounds agree with the rest, which on an H100
#                    ran ours 4-5% faster and the GEMM bound 2-4% slower than after (~2.5 min)
#     sweep_small    the sweep's shapes of T <= 4096, ours on the fused kernels (--backend cute)
#                    with the torch backend timed beside them (~4 min)
#     sweep_graphed  the sweep's shapes of T <= 4096, ours on the fused kernels, with eager and ours
#                    also CUDA-graphed (make_graphed_callables): the host-bound steps with the
#                    host's launches gone (~4 min)
#     tp             2 GPUs (nvidia-h200-x2): the NCCL tests, then the MLP at TP=2, replicated: ours
#                    with and without tp_comm_overlap against Megatron-style eager; then tp-model
#                    on the measured bandwidth (~8 min)
#     tp_sp          the same, sequence parallel, with PyTorch's async TP beside them (~8 min)
#     profile        one MLP step's kernels and idle gaps, ours, eager and quack (torch.profiler), and
#     profile_narrow  where the step's time goes at T=8192 d=4096 swiglu h=1376 (every kernel and the
#                    GPU's idle gaps between them: 44 µs a step against quack's 30 there, H100)
#                    where the host time of one launch goes
#     launch_graphs  the fused function's launch groups replayed from CUDA graphs (launch_graphs.py): their
#                    GPU tests (bitwise the launches' results, the step peak no higher, a capture after
#                    every graph was dropped), then tools/launch_graphs_ab.py: graphs on and off beside
#                    eager at six host-bound steps, held and host µs (~3 min)
#     launch_keys    the fused function's launch-group keys at host-bound steps: how often they are
#                    new (alone, in turns with eager, in the sweep's rounds), which fields change,
#                    what a capture costs (tools/launch_key_churn.py --profile-captures); then
#                    tools/fused_step_probe.py: the fused step against eager in a steady loop
#                    (~2 min)
#     held_turns     tools/held_turns_probe.py: the host-bound steps (fused, the small step, eager)
#                    timed in the sweep's turns, with the collector off, alone and in a steady
#                    loop, and the GPU's idle gaps (~1 min)
#     kernels_vs_quack  tools/kernels_vs_quack.py: each kernel of a step, ours beside quack's MLP,
#                    and the held steps, at the two d=8192 shapes and the headline (~2 min)
#     kernels_vs_quack_below  the same at the two shapes the latest sweeps read below quack
#                    most often (T=4096 d=5120 swiglu h=3456: 0.979-0.999x; T=8192 d=4096 swiglu
#                    h=1376: 0.983-1.024x), which kernel quack runs faster (~2 min)
#     graph_memory   tools/graph_memory_probe.py: the device memory the fused function's kept CUDA
#                    graphs hold, the allocator's and the driver's, at 94-1024 graphs (~1 min)
#     memory_trace   tools/step_memory_trace.py: the allocator's history over the sweep's measured
#                    steps, ours beside eager, at T=512 d=1024 swiglu (default and recompute
#                    modes) and T=512 d=8192 swiglu: where a step peak that asks for eager's bytes
#                    reads more (~1 min)
#     small_step_variants  tools/small_step_variants.py: ways to spell the gated small step in
#                    autograd ops, held and graphed beside eager, at the sweep's gated small steps
#                    (~1 min)
#     small_step_kernels  tools/host_bound_paths.py --kernels at the non-gated small step T=512
#                    d=1024 gelu h=512 (eager's own ops behind the layer): eager, the small step
#                    and the fused paths in paired turns, then each one's kernels under
#                    torch.profiler (~1 min)
#     host_paths     tools/host_bound_paths.py: at the sweep's gated host-bound steps, ours fused
#                    through the C++ apply, the same through torch's Function.apply, the small step
#                    forced, and eager, in 80 paired turns of 0.05 s (~1.5 min)
#     timing_spread  tools/timing_spread.py: eager against a second copy of itself and ours at three
#                    host-bound shapes, held in turns of 0.8, 0.2 and 0.05 s for the same time,
#                    three repeats (~2.5 min)
#     host_step      where a host-bound step's time goes, at four small-step shapes of the sweep:
#                    ours (fused, auto), ours on the torch backend, the small step's ops without
#                    the layer, and eager, with autograd's device threads on and off (~4 min)
#     host_stages    tools/host_speed_stages.py: the host's speed after each thing the sweep
#                    does before its shapes (imports, quack, torch.compile, graphs) (~1.5 min)
#     host_env       tools/host_speed_stages.py --quick in three fresh processes: as started, with
#                    MALLOC_ARENA_MAX=1, and with glibc's mmap and trim thresholds fixed at 1 GiB
#                    (no heap trimmed and grown back per step); each reads its page faults and
#                    context switches per step (~1 min)
#     host_phases    ours on auto (its small step), the small step's ops alone and eager at two
#                    host-bound shapes, interleaved rounds, each step's host time split into
#                    clearing grads, forward and backward, device threads on and off (~2 min)
#     cold           the cold start alone (a new process to its first fwd+bwd, ours and torch's)
#     clock          tools/clock_probe.py: ms, SM clock, power and cycles per call (power-bound?)
#     full           the whole single-GPU bench (GEMMs, fused, MLP, cold start, torch.compile)
#     ncu            ncu on five GEMMs (bench ncu-cases; needs the Firecracker runtime's ncu)
#     ncu_dact       ncu on the swiglu dact at K = 1024 (T=8192 d=1024) and plain GEMMs of its shape
#                    (bench ncu-cases --short-k-dact): where its epilogue's time goes
#     ncu_smem       ncu's shared-memory wavefronts, bank conflicts and stall latencies of the same
#                    cases: how many wavefronts the dact epilogue's preact loads and dpreact stores
#                    take, with the pair swap and without, cooperative 128x128 and pingpong 128x192
#     ncu_dact_pingpong  ncu on that dact and its plain GEMM in the cooperative default and in
#                    pingpong 128x128 (bench ncu-cases --short-k-pingpong): tensor pipe, shared
#                    memory and issue, with and without a mainloop beside the epilogue (~3 min)
#     ncu_vs_quack   tools/ncu_vs_quack.py under ncu: one step of ours and one of quack's MLP at
#                    T=8192 d=8192 gelu h=8192 and the headline, each GEMM's instructions, shared-memory
#                    stores and bank conflicts, DRAM bytes and warp stalls, ours beside quack's
#     ncu_epilogue_gap  ncu on fc1 + act and the dact beside the plain GEMMs of their shapes and
#                    configs (bench ncu-cases --epilogue-gap), at the headline, T=8192 d=4096
#                    swiglu h=1376 and T=8192 d=2048 gelu h=4096, where the dact ran 7-16% above
#                    the plain GEMM held: cycles, clock, DRAM bytes, issue slots and warp stalls
#                    (~3 min)
#   bash tools/gpu_run.sh --list          print the commands, run nothing
#
# Each step runs under `timeout` and appends to $OUT/<step>.txt; a failing step does not stop
# the others. The DSL and torch are byte-compiled first, as a pip install would leave them.
set -u
OUT=${OUT:-/tmp/gpu_run_out}
mkdir -p "$OUT"
export PARALLEL_MLP_CACHE_DIR=${PARALLEL_MLP_CACHE_DIR:-/tmp/pmlp_cache}
BENCH="python3 -m parallel_mlp.bench"

declare -A CMD=(
  [tests_kernels]="timeout 540 python3 -m pytest -q -m gpu tests/kernels -k 'not selfcheck' -x"
  [tests_layer]="timeout 150 python3 -m pytest -q -m gpu tests/test_layer_gpu.py tests/test_backends.py -x"
  [tests_defaults]="timeout 200 python3 tools/pytest_shards.py 8 -m gpu tests/kernels/test_ops_gpu.py -k default_big"
  [tests_all]="timeout 540 python3 tools/pytest_shards.py 8 -m gpu tests/kernels tests/test_layer_gpu.py tests/test_backends.py -k 'not selfcheck'"
  [streamk]="timeout 170 python3 tools/pytest_shards.py 12 -m gpu tests/kernels/test_stream_k_gpu.py; for h in 14336 7168; do timeout 150 $BENCH configs --h \$h --only fc2,dx,dW2,dW1 --also stream_k=1; done"
  [streamk_fill]="timeout 240 python3 tools/pytest_shards.py 12 -m gpu tests/kernels/test_stream_k_gpu.py; timeout 150 $BENCH configs --T 65536 --d 1024 --h 1024 --act gelu_tanh_approx --only dW2,dW1 --also stream_k=1; timeout 150 $BENCH configs --T 65536 --d 2048 --h 704 --act swiglu --only dW2 --also stream_k=1"
  [configs_small]="timeout 200 python3 tools/pytest_shards.py 8 -m gpu tests/kernels/test_stream_k_gpu.py tests/kernels/test_tile_narrow_gpu.py tests/kernels/test_ops_gpu.py -k 't64 or t128 or t256 or 64_wide or rasterization'; timeout 100 $BENCH configs --T 512 --d 1024 --h 2816 --act swiglu --graphed 20 --hold-s 0.4 --only fc1,fc2,dx,dpost --also tile_n=128 --also tile_n=64; timeout 100 $BENCH configs --T 512 --d 1024 --h 2816 --act swiglu --graphed 20 --hold-s 0.4 --only fc2,dx --also stream_k=1; timeout 100 $BENCH configs --T 4096 --d 1024 --h 4096 --act gelu_tanh_approx --graphed 20 --hold-s 0.4 --only fc1,fc2,dx,dpost --also cluster_m=2 --also cluster_m=1; timeout 100 $BENCH configs --T 1000 --d 5120 --h 10240 --act gelu_tanh_approx --graphed 20 --hold-s 0.4 --only fc2,dx --also cluster_m=1; timeout 100 $BENCH configs --T 65536 --d 1024 --h 1024 --act gelu_tanh_approx --hold-s 0.5 --only dW2,dW1 --also stream_k=0,tile_n=128,cluster_m=1 --also stream_k=0,tile_n=64,cluster_m=1; timeout 100 $BENCH configs --T 65536 --d 2048 --h 704 --act swiglu --hold-s 0.5 --only dW2,dW1 --also stream_k=0,tile_n=128,cluster_m=1"
  [configs_wave]="timeout 100 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --T 512 --d 1024 --h 2816 --act swiglu --only fc1,dW2,dW1 --also tile_n=128,cluster_m=1 --also tile_n=256; timeout 80 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --T 512 --d 8192 --h 2752 --act swiglu --only fc1 --also tile_n=128,stream_k=1; timeout 90 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --T 2048 --d 2048 --h 2816 --act swiglu --only dpost,dW2 --also tile_n=256; timeout 60 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --T 1000 --d 2048 --h 5632 --act swiglu --only dpost --also tile_n=256; timeout 80 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --T 8192 --d 1024 --h 2816 --act swiglu --only dW2,dW1 --also tile_n=128,stream_k=1 --also tile_n=192,cluster_m=1,stream_k=0; timeout 80 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --T 1000 --d 5120 --h 10240 --act gelu_tanh_approx --only fc2,dx --also tile_n=192,stream_k=0"
  [configs_mid]="timeout 70 $BENCH configs --hold-s 0.5 --rounds 4 --also consumers=cooperative,tile_n=256 --T 8192 --d 4096 --h 2048 --act gelu_tanh_approx --only fc1,fc2,dx; timeout 70 $BENCH configs --hold-s 0.5 --rounds 4 --also consumers=cooperative,tile_n=256 --T 8192 --d 2048 --h 4096 --act gelu_tanh_approx --only fc1,fc2,dx; timeout 70 $BENCH configs --hold-s 0.5 --rounds 4 --also consumers=cooperative,tile_n=256 --T 16384 --d 5120 --h 2560 --act gelu_tanh_approx --only fc1,fc2,dx; timeout 70 $BENCH configs --hold-s 0.5 --rounds 4 --also consumers=cooperative,tile_n=256 --T 8192 --d 4096 --h 1376 --act swiglu --only fc1,fc2,dx; timeout 70 $BENCH configs --hold-s 0.5 --rounds 4 --also consumers=cooperative,tile_n=256 --T 4096 --d 5120 --h 3456 --act swiglu --only fc1,fc2,dx; timeout 60 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --also consumers=cooperative,tile_n=256 --T 4096 --d 1024 --h 4096 --act gelu_tanh_approx --only fc1"
  [configs_long_k]="timeout 100 $BENCH configs --hold-s 0.4 --rounds 4 --also consumers=pingpong,tile_n=192 --T 16384 --d 8192 --h 11008 --act swiglu --only fc2,dx; timeout 60 $BENCH configs --hold-s 0.4 --rounds 4 --also consumers=pingpong,tile_n=192 --T 8192 --d 8192 --h 5504 --act swiglu --only dx; timeout 60 $BENCH configs --hold-s 0.4 --rounds 4 --also consumers=cooperative,tile_n=256 --T 8192 --d 8192 --h 8192 --act gelu_tanh_approx --only fc1,fc2,dx; timeout 120 python3 tools/option_ab.py --also consumers=cooperative,tile_n=256 --where consumers=pingpong,tile_n=192,epi_n=32 --shapes 16384:8192:11008:swiglu,8192:8192:8192:gelu_tanh_approx --rounds 4"
  [configs_dact]="for s in '8192 1024 2816' '65536 1024 2816' '8192 2048 5632' '65536 2048 704' '8192 4096 1376' '8192 4096 14336'; do set -- \$s; timeout 100 $BENCH configs --hold-s 0.5 --rounds 4 --also consumers=cooperative,tile_n=128,cluster_m=1,raster_group=8,dact_prefetch=1,epi_n=32 --also consumers=pingpong,tile_n=192,cluster_m=2,raster_group=16,dact_prefetch=2,epi_n=16 --T \$1 --d \$2 --h \$3 --act swiglu --only dpost; done"
  [configs_swap]="timeout 200 python3 tools/pytest_shards.py 12 -m gpu tests/kernels/test_dact_pair_swap_gpu.py; for s in '8192 1024 2816' '65536 1024 2816' '8192 2048 5632' '65536 2048 704' '8192 4096 1376' '8192 4096 14336'; do set -- \$s; timeout 100 $BENCH configs --hold-s 0.5 --rounds 4 --also dact_pair_swap=0 --also consumers=cooperative,tile_n=128,cluster_m=1,raster_group=8,dact_prefetch=1,epi_n=32 --also consumers=cooperative,tile_n=128,cluster_m=1,raster_group=8,dact_prefetch=1,epi_n=32,dact_pair_swap=0 --T \$1 --d \$2 --h \$3 --act swiglu --only dpost; done"
  [configs_ring]="timeout 200 python3 tools/pytest_shards.py 12 -m gpu tests/kernels/test_ops_gpu.py -k dact_in_place; for s in '8192 1024 2816 swiglu' '65536 1024 2816 swiglu' '65536 1024 1024 gelu_tanh_approx'; do set -- \$s; timeout 100 $BENCH configs --hold-s 0.4 --rounds 4 --also dact_prefetch=2 --also dact_prefetch=3 --also dact_prefetch=3,epi_n=16 --T \$1 --d \$2 --h \$3 --act \$4 --only dpost; done; for s in '8192 2048 5632 swiglu' '65536 2048 704 swiglu' '8192 4096 1376 swiglu' '8192 4096 14336 swiglu' '8192 2048 4096 gelu_tanh_approx' '8192 4096 2048 gelu_tanh_approx'; do set -- \$s; timeout 100 $BENCH configs --hold-s 0.4 --rounds 4 --also consumers=cooperative,tile_n=128,raster_group=8,epi_n=32,dact_prefetch=3,cluster_m=1 --also consumers=cooperative,tile_n=128,raster_group=8,epi_n=32,dact_prefetch=3,cluster_m=2,raster_group=16 --T \$1 --d \$2 --h \$3 --act \$4 --only dpost; done"
  [configs_raster]="timeout 100 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:14336:swiglu,8192:8192:8192:gelu_tanh_approx,16384:8192:11008:swiglu --also raster_along=n,raster_group=16,serpentine=0 --also raster_along=m,raster_group=8,serpentine=1 -j 16; for s in '8192 4096 14336 swiglu' '8192 8192 8192 gelu_tanh_approx' '16384 8192 11008 swiglu'; do set -- \$s; timeout 150 $BENCH configs --hold-s 0.5 --rounds 4 --also raster_along=n,raster_group=16,serpentine=0 --also raster_along=m,raster_group=8,serpentine=1 --T \$1 --d \$2 --h \$3 --act \$4; done"
  [configs_narrow_gelu]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:2048:gelu_tanh_approx,16384:5120:2560:gelu_tanh_approx --also consumers=pingpong,tile_n=128 --also consumers=pingpong,tile_n=192 --also consumers=pingpong,tile_n=192,dact_prefetch=2,epi_n=16 --also consumers=cooperative,tile_n=256,dact_prefetch=1,epi_n=32 --also consumers=cooperative,tile_n=128,dact_prefetch=3,epi_n=32 --also cluster_m=1 -j 16; for s in '8192 4096 2048' '16384 5120 2560'; do set -- \$s; timeout 150 $BENCH configs --hold-s 0.4 --rounds 4 --only fc1,dpost --also consumers=pingpong,tile_n=128 --also consumers=pingpong,tile_n=192 --also consumers=pingpong,tile_n=192,dact_prefetch=2,epi_n=16 --also consumers=cooperative,tile_n=256,dact_prefetch=1,epi_n=32 --also consumers=cooperative,tile_n=128,dact_prefetch=3,epi_n=32 --also cluster_m=1 --T \$1 --d \$2 --h \$3 --act gelu_tanh_approx; done"
  [configs_narrow_n]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:1376:swiglu,16384:4096:1376:swiglu,4096:4096:688:swiglu,8192:3584:2368:swiglu --also tile_n=256,stream_k=1 --also stream_k=1 --also tile_n=160,stream_k=1 --also tile_n=128,stream_k=0 --also consumers=cooperative,tile_n=256 -j 16; for s in '8192 4096 1376' '16384 4096 1376' '4096 4096 688' '8192 3584 2368'; do set -- \$s; timeout 100 $BENCH configs --hold-s 0.4 --rounds 4 --only fc1,dW2 --also tile_n=256,stream_k=1 --also stream_k=1 --also tile_n=160,stream_k=1 --also tile_n=128,stream_k=0 --also consumers=cooperative,tile_n=256 --T \$1 --d \$2 --h \$3 --act swiglu; done; timeout 200 $BENCH sweep --shape 8192,4096,swiglu,1376 --rounds 8 --skip-compile"
  [configs_narrow_ring]="timeout 100 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:2048:gelu_tanh_approx,16384:5120:2560:gelu_tanh_approx --also dact_prefetch=2 --also dact_prefetch=3 --also epi_n=16 -j 16; for s in '8192 4096 2048' '16384 5120 2560'; do set -- \$s; timeout 120 $BENCH configs --hold-s 0.4 --rounds 4 --only fc1,dpost --also dact_prefetch=2 --also dact_prefetch=3 --also epi_n=16 --T \$1 --d \$2 --h \$3 --act gelu_tanh_approx; done"
  [configs_sk_pingpong]="timeout 150 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:1376:swiglu,4096:4096:1792:swiglu,4096:4096:2752:swiglu,2048:4096:3584:swiglu,4096:5120:1728:swiglu,4096:3584:2368:swiglu,4096:3584:4736:swiglu --also consumers=pingpong,tile_n=192,stream_k=0,raster_along=m,raster_group=8,serpentine=1 --also consumers=cooperative,tile_n=256,stream_k=1,raster_along=n,raster_group=16,serpentine=0 -j 16; for s in '8192 4096 1376 fc1' '4096 4096 1792 fc1' '4096 4096 2752 fc1' '2048 4096 3584 fc1' '4096 5120 1728 fc1' '4096 3584 2368 dx' '4096 3584 4736 fc2'; do set -- \$s; timeout 100 $BENCH configs --hold-s 0.4 --rounds 6 --only \$4 --also consumers=pingpong,tile_n=192,stream_k=0,raster_along=m,raster_group=8,serpentine=1 --also consumers=cooperative,tile_n=256,stream_k=1,raster_along=n,raster_group=16,serpentine=0 --T \$1 --d \$2 --h \$3 --act swiglu; done; timeout 150 python3 tools/pytest_shards.py 8 --deadline 140 -m gpu tests/kernels/test_ops_gpu.py -k 'default_big and sk_over_pingpong'; timeout 200 $BENCH sweep --shape 8192,4096,swiglu,1376 --rounds 8 --skip-compile --no-eager-recompute"
  [configs_pairs]="timeout 150 python3 tools/pytest_shards.py 4 -m gpu tests/kernels/test_ops_gpu.py -k few_rows; for s in '1000 5120 10240 gelu_tanh_approx' '1000 4096 11008 swiglu'; do set -- \$s; timeout 100 $BENCH configs --hold-s 0.4 --rounds 4 --only fc1,dpost --also cluster_m=1 --T \$1 --d \$2 --h \$3 --act \$4; done; timeout 150 $BENCH sweep --shape 1000,5120,gelu_tanh_approx,10240 --shape 1000,4096,swiglu,11008 --rounds 3 --no-quack --skip-compile --no-eager-recompute --json $OUT/sweep-t1000-pairs.json"
  [configs_one_wave]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 512:8192:2752:swiglu,2048:2048:2816:swiglu,4096:1024:4096:gelu_tanh_approx,1000:4096:11008:swiglu --also tile_n=128,cluster_m=1 --also cluster_m=1 --also cluster_m=2 -j 16; for s in '512 8192 2752 swiglu 20' '2048 2048 2816 swiglu 20' '4096 1024 4096 gelu_tanh_approx 20' '1000 4096 11008 swiglu 0'; do set -- \$s; timeout 80 $BENCH configs --graphed \$5 --hold-s 0.4 --rounds 4 --only fc2,dx,dW2,dW1 --also tile_n=128,cluster_m=1 --also cluster_m=1 --also cluster_m=2 --T \$1 --d \$2 --h \$3 --act \$4; done"
  [configs_below_bound]="timeout 150 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:2752:swiglu,8192:4096:5504:swiglu,4096:5120:3456:swiglu --also consumers=cooperative,tile_n=256,stream_k=1,raster_along=n,raster_group=16,serpentine=0 --also tile_n=128 -j 16; for s in '8192 4096 2752' '8192 4096 5504' '4096 5120 3456'; do set -- \$s; timeout 130 $BENCH configs --hold-s 0.4 --rounds 4 --also consumers=cooperative,tile_n=256,stream_k=1,raster_along=n,raster_group=16,serpentine=0 --also tile_n=128 --T \$1 --d \$2 --h \$3 --act swiglu; done"
  [tests_pdl]="timeout 200 python3 tools/pytest_shards.py 12 --deadline 180 -m gpu tests/kernels/test_pdl_gpu.py"
  [pdl]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 8192:1024:2816:swiglu,65536:1024:2816:swiglu,65536:1024:1024:gelu_tanh_approx,8192:4096:2048:gelu_tanh_approx,8192:4096:1376:swiglu,8192:4096:14336:swiglu,2048:2048:2816:swiglu,4096:1024:4096:gelu_tanh_approx,512:1024:2816:swiglu --also pdl=1 -j 16; timeout 200 python3 tools/pdl_ab.py; timeout 80 $BENCH configs --hold-s 0.4 --rounds 4 --also pdl=1; for s in '512 1024 2816 swiglu' '4096 1024 4096 gelu_tanh_approx'; do set -- \$s; timeout 60 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 4 --also pdl=1 --T \$1 --d \$2 --h \$3 --act \$4; done"
  [short_k_probe]="timeout 100 python3 -m parallel_mlp.kernels.warmup --shapes 65536:1024:2816:swiglu,8192:1024:2816:swiglu,65536:1024:1024:gelu_tanh_approx --also num_sms=66 --also num_sms=100 --also l2_prefetch=1 --also l2_prefetch=1,dact_prefetch=3 --also epi_n=16 -j 16; for s in '65536 1024 2816 swiglu' '8192 1024 2816 swiglu' '65536 1024 1024 gelu_tanh_approx'; do set -- \$s; timeout 120 $BENCH configs --hold-s 0.4 --rounds 4 --also num_sms=66 --also num_sms=100 --also l2_prefetch=1 --also l2_prefetch=1,dact_prefetch=3 --also epi_n=16 --T \$1 --d \$2 --h \$3 --act \$4 --only dpost; done"
  [plain_gemms]="timeout 580 python3 tools/plain_gemms.py --json $OUT/plain_gemms.json"
  [plain_gemms_host]="timeout 200 python3 tools/plain_gemms.py --tokens 512,2048,4096 --no-graph --json $OUT/plain_gemms_host.json"
  [gemm]="timeout 500 $BENCH gemm --budget-s 420 --json $OUT/gemm.json"
  [mlp]="timeout 200 $BENCH mlp --skip-compile --iters 15 --warmup 3 --budget-s 170 --json $OUT/mlp.json"
  [sweep]="timeout 580 $BENCH sweep --json $OUT/sweep.json --png $OUT/sweep.png"
  [sweep_ceiling]="timeout 585 $BENCH sweep --ceiling --budget-s 540 --json $OUT/sweep.json --png $OUT/sweep.png"
  [sweep_plain_launches]="timeout 585 $BENCH sweep --no-launch-graphs --budget-s 540 --json $OUT/sweep-plain-launches.json --png $OUT/sweep-plain-launches.png"
  [sweep_below_eager]="timeout 400 $BENCH sweep --shape 512,1024,gelu_tanh_approx --shape 4096,1024,gelu_tanh_approx --shape 8192,4096,gelu_tanh_approx,2048 --shape 512,1024,swiglu --rounds 8 --no-quack --skip-compile --no-eager-recompute --json $OUT/sweep-below-eager.json"
  [sweep_below_target]="timeout 330 $BENCH sweep --ceiling --shape 8192,4096,swiglu,14336 --shape 4096,5120,swiglu,3456 --shape 16384,8192,swiglu,11008 --shape 16384,5120,gelu_tanh_approx,2560 --rounds 6 --skip-compile --no-eager-recompute --json $OUT/sweep-below-target.json"
  [sweep_heat]="timeout 330 $BENCH sweep --ceiling --shape 8192,4096,swiglu,14336 --shape 8192,4096,swiglu,11008 --rounds 6 --heat-s 10 --skip-compile --no-eager-recompute --json $OUT/sweep-heat.json"
  [sweep_small]="timeout 400 $BENCH sweep --backend cute --torch-backend --tokens 512,1000,2048,4096 --json $OUT/sweep-small.json"
  [sweep_graphed]="timeout 420 $BENCH sweep --backend cute --graphed --no-quack --skip-compile --tokens 512,1000,2048,4096 --json $OUT/sweep-graphed.json"
  [tp]="timeout 120 python3 -m pytest -q -m gpu tests/test_layer_gpu.py -k nccl; timeout 420 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m parallel_mlp.bench tp --configs swiglu:28672,swiglu:14336,gelu_tanh_approx:32768 --json $OUT/tp.json; python3 -m parallel_mlp.bench tp-model --tp-json $OUT/tp.json"
  [tp_sp]="timeout 480 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m parallel_mlp.bench tp --sequence-parallel --configs swiglu:28672,swiglu:14336,gelu_tanh_approx:32768 --json $OUT/tp-sp.json"
  [profile]="timeout 200 $BENCH profile && timeout 150 $BENCH profile --h 7168 && timeout 60 $BENCH host"
  [profile_narrow]="timeout 200 $BENCH profile --T 8192 --d 4096 --h 1376 --act swiglu --steps 10"
  [launch_graphs]="timeout 150 python3 tools/pytest_shards.py 12 -m gpu tests/test_layer_gpu.py -k launch_graphs; timeout 200 python3 tools/launch_graphs_ab.py"
  [held_turns]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 512:1024:512:gelu_tanh_approx,512:1024:2816:swiglu,4096:1024:4096:gelu_tanh_approx -j 16; timeout 400 python3 tools/held_turns_probe.py"
  [kernels_vs_quack]="timeout 150 python3 -m parallel_mlp.kernels.warmup --shapes 8192:8192:8192:gelu_tanh_approx,16384:8192:11008:swiglu,8192:4096:14336:swiglu -j 16; timeout 400 python3 tools/kernels_vs_quack.py --rounds 6"
  [kernels_vs_quack_below]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 4096:5120:3456:swiglu,8192:4096:1376:swiglu -j 16; timeout 300 python3 tools/kernels_vs_quack.py --rounds 6 --shape 4096,5120,3456,swiglu --shape 8192,4096,1376,swiglu"
  [graph_memory]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 512:1024:2816:swiglu,4096:1024:4096:gelu_tanh_approx -j 16; timeout 100 python3 tools/graph_memory_probe.py; timeout 100 python3 tools/graph_memory_probe.py --shape 4096,1024,4096,gelu_tanh_approx --input-sets 32; timeout 100 python3 tools/graph_memory_probe.py --input-sets 256"
  [launch_keys]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 512:1024:512:gelu_tanh_approx,512:1024:2816:swiglu,4096:1024:4096:gelu_tanh_approx,8192:1024:2816:swiglu -j 16; timeout 200 python3 tools/launch_key_churn.py --profile-captures; timeout 120 python3 tools/fused_step_probe.py"
  [memory_trace]="timeout 120 python3 tools/step_memory_trace.py; timeout 120 python3 tools/step_memory_trace.py --recompute; timeout 120 python3 tools/step_memory_trace.py --shape 512,8192,2752,swiglu"
  [small_step_variants]="timeout 260 python3 tools/small_step_variants.py"
  [small_step_kernels]="timeout 200 python3 tools/host_bound_paths.py --shape 512,1024,512,gelu_tanh_approx --rounds 40 --kernels"
  [host_paths]="timeout 300 python3 tools/host_bound_paths.py"
  [timing_spread]="timeout 240 python3 tools/timing_spread.py"
  [host_step]="for s in 512,1024,2816,swiglu 512,1024,512,gelu_tanh_approx 4096,1024,4096,gelu_tanh_approx 512,8192,2752,swiglu; do timeout 150 $BENCH host --step --calls 200 --shape \$s; done"
  [host_phases]="for s in 512,1024,2816,swiglu 4096,1024,4096,gelu_tanh_approx; do timeout 150 $BENCH host --step --phases --calls 100 --shape \$s; done"
  [host_stages]="timeout 200 python3 tools/host_speed_stages.py"
  [host_env]="timeout 60 python3 tools/host_speed_stages.py --quick; MALLOC_ARENA_MAX=1 timeout 60 python3 tools/host_speed_stages.py --quick; MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 timeout 60 python3 tools/host_speed_stages.py --quick"
  [cold]="timeout 120 $BENCH cold --json $OUT/cold.json"
  [clock]="timeout 120 python3 tools/clock_probe.py --h 7168 && timeout 150 python3 tools/clock_probe.py --h 14336"
  [full]="timeout 570 $BENCH --budget-s 420 --json $OUT/bench.json --png $OUT/bench.png"
  [ncu]="timeout 240 ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 5 --launch-count 5 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis $BENCH ncu-cases"
  [ncu_smem]="timeout 240 ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 6 --launch-count 6 --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,smsp__inst_executed_op_global_ld.sum,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio $BENCH ncu-cases --short-k-dact"
  [ncu_vs_quack]="timeout 100 python3 -m parallel_mlp.kernels.warmup --shapes 8192:8192:8192:gelu_tanh_approx,8192:4096:14336:swiglu -j 16; timeout 420 ncu --clock-control none --profile-from-start off --kernel-name regex:kernel_cutlass --section SpeedOfLight --section WarpStateStats --section InstructionStats --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,dram__bytes_read.sum,dram__bytes_write.sum python3 tools/ncu_vs_quack.py"
  [ncu_epilogue_gap]="timeout 100 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:14336:swiglu,8192:4096:1376:swiglu,8192:2048:4096:gelu_tanh_approx -j 16; timeout 300 ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 15 --launch-count 15 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_elapsed.avg,gpc__cycles_elapsed.avg.per_second,smsp__inst_executed.sum $BENCH ncu-cases --epilogue-gap 8192,4096,14336,swiglu --epilogue-gap 8192,4096,1376,swiglu --epilogue-gap 8192,2048,4096,gelu_tanh_approx"
  [ncu_dact_pingpong]="timeout 100 python3 -m parallel_mlp.kernels.warmup --shapes 8192:1024:2816:swiglu --also consumers=pingpong,tile_n=128,cluster_m=2,dact_prefetch=2,epi_n=16 -j 16; timeout 240 ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 4 --launch-count 4 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --metrics \$(ncu --query-metrics 2>/dev/null | grep -q sm__pipe_tensor_op_gmma_cycles_active && echo sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,)l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg $BENCH ncu-cases --short-k-pingpong"
  [tests_overlap]="timeout 120 python3 -m pytest -q -x -m gpu 'tests/kernels/test_handoff_gpu.py::test_handoff_dact[swiglu-shape1-handoff]' 'tests/kernels/test_tile192_gpu.py::test_three_warpgroup_tile_dact[swiglu-shape1-coop3_pf2]' || { echo 'the two schedules failed or hung their first GPU test: stopping the step'; exit 1; }; timeout 400 python3 tools/pytest_shards.py 8 --deadline 390 -m gpu tests/kernels/test_tile192_gpu.py tests/kernels/test_handoff_gpu.py -k 'three_warpgroup or handoff'"
  [configs_overlap]="timeout 120 python3 -m pytest -q -x -m gpu 'tests/kernels/test_handoff_gpu.py::test_handoff_dact[swiglu-shape1-handoff]' 'tests/kernels/test_tile192_gpu.py::test_three_warpgroup_tile_dact[swiglu-shape1-coop3_pf2]' || { echo 'the two schedules failed or hung their first GPU test: stopping the step'; exit 1; }; timeout 240 python3 -m parallel_mlp.kernels.warmup --shapes 8192:1024:2816:swiglu,65536:1024:2816:swiglu,65536:1024:1024:gelu_tanh_approx,4096:1024:4096:gelu_tanh_approx,8192:2048:5632:swiglu,8192:4096:2048:gelu_tanh_approx,16384:5120:2560:gelu_tanh_approx,8192:4096:14336:swiglu --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=3,epi_n=16 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=3,epi_n=16 -j 16; for s in '8192 1024 2816 swiglu' '65536 1024 2816 swiglu' '65536 1024 1024 gelu_tanh_approx'; do set -- \$s; timeout 70 $BENCH configs --hold-s 0.4 --rounds 6 --only dpost --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=3,epi_n=16 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=3,epi_n=16 --T \$1 --d \$2 --h \$3 --act \$4; done; timeout 50 $BENCH configs --graphed 20 --hold-s 0.4 --rounds 6 --only dpost --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=3,epi_n=16 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=3,epi_n=16 --T 4096 --d 1024 --h 4096 --act gelu_tanh_approx; timeout 40 $BENCH configs --hold-s 0.4 --rounds 6 --only dpost --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --T 8192 --d 2048 --h 5632 --act swiglu; for s in '8192 4096 2048' '16384 5120 2560'; do set -- \$s; timeout 60 $BENCH configs --hold-s 0.4 --rounds 6 --only fc1,dpost --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --T \$1 --d \$2 --h \$3 --act gelu_tanh_approx; done; timeout 150 $BENCH configs --hold-s 0.4 --rounds 4 --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --T 8192 --d 4096 --h 14336 --act swiglu"
  [overlap_ab]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 8192:1024:2816:swiglu,65536:1024:2816:swiglu,65536:1024:1024:gelu_tanh_approx --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 -j 16; timeout 200 python3 tools/option_ab.py --also consumers=handoff,tile_m=128,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=16 --where dact_prefetch=3 --shapes 8192:1024:2816:swiglu,65536:1024:2816:swiglu,65536:1024:1024:gelu_tanh_approx; timeout 200 python3 tools/option_ab.py --also consumers=cooperative,tile_m=192,tile_n=128,stream_k=0,dact_prefetch=2,epi_n=32 --where dact_prefetch=3 --shapes 8192:1024:2816:swiglu,65536:1024:2816:swiglu,65536:1024:1024:gelu_tanh_approx"
  [configs_sk160]="timeout 120 python3 -m parallel_mlp.kernels.warmup --shapes 8192:4096:1376:swiglu,16384:4096:1376:swiglu,8192:5120:1728:swiglu,16384:5120:1728:swiglu,8192:3584:2368:swiglu,16384:3584:2368:swiglu,8192:3584:4736:swiglu --also consumers=cooperative,tile_n=160,stream_k=1 -j 16; for s in '8192 4096 1376' '16384 4096 1376' '8192 5120 1728' '16384 5120 1728' '8192 3584 2368' '16384 3584 2368' '8192 3584 4736'; do set -- \$s; timeout 50 $BENCH configs --hold-s 0.4 --rounds 6 --only dW2 --also consumers=cooperative,tile_n=160,stream_k=1 --T \$1 --d \$2 --h \$3 --act swiglu; done"
  [ncu_dact]="timeout 240 ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 6 --launch-count 6 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section ComputeWorkloadAnalysis --section InstructionStats $BENCH ncu-cases --short-k-dact"
)
ORDER=(tests_kernels tests_layer tests_defaults tests_all streamk streamk_fill configs_small configs_wave configs_mid configs_long_k configs_dact configs_swap configs_ring configs_raster configs_narrow_gelu configs_narrow_ring configs_narrow_n configs_sk_pingpong configs_below_bound configs_pairs configs_one_wave tests_overlap configs_overlap overlap_ab configs_sk160 tests_pdl pdl short_k_probe plain_gemms plain_gemms_host gemm mlp sweep sweep_ceiling sweep_plain_launches sweep_below_eager sweep_below_target sweep_heat sweep_small sweep_graphed tp tp_sp profile profile_narrow launch_graphs launch_keys held_turns kernels_vs_quack kernels_vs_quack_below graph_memory memory_trace small_step_variants small_step_kernels host_paths timing_spread host_step host_stages host_env host_phases cold clock full ncu ncu_dact ncu_dact_pingpong ncu_smem ncu_vs_quack ncu_epilogue_gap)

steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
  echo "usage: bash tools/gpu_run.sh STEP [STEP ...] | --list; steps: ${ORDER[*]}" >&2
  exit 2
fi
if [ "${steps[0]}" = "--list" ]; then
  for s in "${ORDER[@]}"; do printf '%-13s %s\n' "$s" "${CMD[$s]}"; done
  exit 0
fi
for s in "${steps[@]}"; do
  if [ -z "${CMD[$s]+x}" ]; then echo "unknown step '$s'; steps: ${ORDER[*]}" >&2; exit 2; fi
done

# Bytecode for the DSL and for torch's site-packages: the GPU host's copies ship without any
# (torch's import took 5.8 s there, most of it compiling ~3000 modules, in every new process;
# building a model on the meta device imports sympy, another ~2 s); pip writes bytecode at
# install time, so a user's second process never pays that.
dirs=$(python3 -c "
import importlib.util as u, os
up = lambda p, n: p if n == 0 else up(os.path.dirname(p), n - 1)
# the DSL's root is 3 above cutlass/__init__; torch's site-packages (sympy, numpy, ... are
# imported with it) is 2 above torch/__init__
for name, levels in (('cutlass', 3), ('torch', 2)):
    s = u.find_spec(name)
    if s and s.origin:
        print(up(s.origin, levels))" 2>/dev/null)
for dir in $dirs; do python3 -m compileall -q -j 16 "$dir" >/dev/null 2>&1; done

for s in "${steps[@]}"; do
  echo "=== $s: ${CMD[$s]}" | tee -a "$OUT/$s.txt"
  start=$(date +%s)
  bash -c "${CMD[$s]}" >> "$OUT/$s.txt" 2>&1
  rc=$?
  echo "=== $s: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/$s.txt"
  grep -v -i "warning\|smem = utils" "$OUT/$s.txt" | tail -25
done
