#!/usr/bin/env bash
# One device call that checks and times what a kernel change touches, so a 30-minute device
# budget goes into measurements rather than machine starts. Run on the GPU host from the repo
# root (after the device bundle's env.sh and `pip install -e .`); results go under $OUT.
#
#   bash tools/gpu_run.sh STEP [STEP ...]  in order; a device call may run 600 s at most, and
#                                         tests_kernels alone compiles ~300 kernels (~6 min):
#     tests_kernels  GPU tests of the kernels (incl. pingpong, dynamic, in-place dact)
#     tests_layer    ParallelMLP on cute vs the fp64 reference, recompute, main_grad, and
#                    the torch backend's CUDA paths (~1 min)
#     tests_all      both of the above as 8 concurrent pytest shards (tools/pytest_shards.py):
#                    compiling is most of their time and the host has 16 cores
#     prefetch     the L2 prefetch option's GPU tests, and dact / accumulate timed with and
#                  without it (l2_prefetch; also with dact_prefetch=2), h=14336 and h=7168
#     epi16        the epi_n=16 / two-slot pingpong dact / 256x128 options: their GPU tests, then
#                  the dact (h=7168, 14336) and the plain GEMMs timed against the defaults
#     tiles192     the 192x128 pingpong tile's GPU tests (with 128x192's), then every GEMM held
#                  at the default (128x192) beside 128x128, 192x128 c1x2 and raster group 8,
#                  (h=14336 and 7168; ~6 min)
#     largek       held, the N=4096 / large-K GEMMs (fc2, dx, dW1) and the dact at the default
#                  beside cooperative 128x256 c2x1 (raster group 16 and 8) and pingpong 128x128,
#                  at swiglu h=14336, h=7168 and gelu_tanh_approx h=16384 (~4 min)
#     hints        GemmConfig(cache_hints=...): its GPU tests (bitwise twins), then held, at
#                  the default ("normal") beside cache_hints none / stream / keep: every GEMM
#                  at h=14336, dy@W2 (+dact) and dW2 at h=7168; and clock_probe's MHz / W (~4 min)
#     bench_gemm   the six GEMMs + fused ops vs cuBLAS, h=14336 and h=7168
#     sweep        the tuning candidates at raster groups 8 and 16 on the three biggest GEMMs,
#                  and every GEMM with pingpong 128x128 c2x1 g16 / cooperative g16 beside it
#     mlp          whole MLP fwd+bwd vs eager (no torch.compile, no cold start)
#     profile      one MLP step's kernels and idle gaps, ours and eager (torch.profiler), and
#                  where the host time of one launch goes
#     cold         the cold start alone (a new process to its first fwd+bwd, ours and torch's)
#     clock        tools/clock_probe.py: ms, SM clock, power and cycles per call (power-bound?)
#     full         the whole parallel_mlp.bench (GEMMs, fused, MLP, cold start, torch.compile)
#     ncu          ncu on profile_cases (five GEMMs; needs the Firecracker runtime's ncu)
#     retime       every GEMM at h=14336 and 7168, held 1 s, at the default beside pingpong
#                  128x128 and pingpong 128x192 (same cluster and raster group): the tile
#                  choices sessions 5-6 made at 0.5 s turns (~7 min)
#     narrow       the 128x160 pingpong tile: its GPU tests (bitwise twins of 128x128),
#                  then held, fc1 and dy@W2 (+dact) at h=7168 (N = 14336 / 7168, where 192 leaves
#                  a partial last wave) and dy@W2 at h=14336, beside the default (~4 min)
#     streamk      stream-K (GemmConfig.stream_k): its GPU tests (reference, determinism, whole-tile
#                  agreement), then held, the long-K GEMMs (fc2, dx, dW2, dW1) at h=14336 and 7168
#                  beside the default (~5 min)
#     position     three columns of the same kernel held in turn (dy@W2 +dact / plain, fc2, dx):
#                  any spread between them is the timing protocol's, not the kernels' (~1 min)
#   bash tools/gpu_run.sh --list          print the commands, run nothing
#
# bench_gemm holds each column 1 s per turn since session 7 (timing.DEFAULT_HOLD_S; 0.5 s turns
# measured the card's clock swing): its steps take about twice as long as their notes say.
#
# Each step runs under `timeout` and appends to $OUT/<step>.txt; a failing step does not stop
# the others. The DSL and torch are byte-compiled first, as a pip install would leave them.
set -u
OUT=${OUT:-/tmp/gpu_run_out}
mkdir -p "$OUT"
export PARALLEL_MLP_CACHE_DIR=${PARALLEL_MLP_CACHE_DIR:-/tmp/pmlp_cache}

declare -A CMD=(
  [tests_kernels]="timeout 540 python3 -m pytest -q -m gpu tests/kernels -k 'not selfcheck' -x"
  [tests_layer]="timeout 150 python3 -m pytest -q -m gpu tests/test_layer_gpu.py tests/test_backends.py -x"
  [tests_all]="timeout 540 python3 tools/pytest_shards.py 8 -m gpu tests/kernels tests/test_layer_gpu.py tests/test_backends.py -k 'not selfcheck'"
  [prefetch]="timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_l2_prefetch_gpu.py -x; for h in 14336 7168; do timeout 240 python3 -m parallel_mlp.bench configs --h \$h --only dpost,dW1,dW2 --also l2_prefetch=1 --also l2_prefetch=1,dact_prefetch=2; done"
  [epi16]="timeout 200 python3 tools/pytest_shards.py 12 -m gpu tests/kernels/test_epi16_gpu.py; for h in 7168 14336; do timeout 240 python3 -m parallel_mlp.bench configs --h \$h --only dpost --also dact_prefetch=2,epi_n=16 --also epi_n=16 --also dact_prefetch=2; done; timeout 300 python3 -m parallel_mlp.bench configs --only fc1,fc2,dx,dW2,dW1 --also tile_m=256,tile_n=128,cluster_m=1,cluster_n=2,raster_group=8,consumers=cooperative,l2_prefetch=0,epi_n=16 --also epi_n=16"
  [tiles192]="timeout 150 python3 tools/pytest_shards.py 14 -m gpu tests/kernels/test_tile192_gpu.py; for a in '--h 14336' '--h 7168'; do timeout 280 python3 -m parallel_mlp.bench configs \$a --also tile_n=128 --also tile_m=192,tile_n=128,cluster_m=1,cluster_n=2,epi_n=16 --also raster_group=8; done"
  [largek]="coop=consumers=cooperative,tile_n=256,dact_prefetch=1,epi_n=32; for a in '--h 14336' '--h 7168' '--h 16384 --act gelu_tanh_approx'; do timeout 300 python3 -m parallel_mlp.bench configs \$a --only fc2,dx,dW1,dpost --also \$coop --also \$coop,raster_group=8 --also tile_n=128; done"
  [hints]="timeout 150 python3 tools/pytest_shards.py 12 -m gpu tests/kernels/test_cache_hints_gpu.py; timeout 340 python3 -m parallel_mlp.bench configs --h 14336 --also cache_hints=none --also cache_hints=stream --also cache_hints=keep; timeout 200 python3 -m parallel_mlp.bench configs --h 7168 --only dpost,dW2 --also cache_hints=none --also cache_hints=stream --also cache_hints=keep; timeout 120 python3 tools/clock_probe.py --h 14336 --also cache_hints=none --also cache_hints=stream"
  [bench_gemm]="timeout 240 python3 -m parallel_mlp.bench configs && timeout 180 python3 -m parallel_mlp.bench configs --h 7168"
  [sweep]="timeout 560 python3 -m parallel_mlp.bench configs --sweep --only fc1,dx,dW1 --groups 8,16; timeout 400 python3 -m parallel_mlp.bench configs --also consumers=pingpong,tile_n=128,raster_group=16 --also raster_group=16"
  [mlp]="timeout 200 python3 -m parallel_mlp.bench mlp --skip-compile --iters 15 --warmup 3 --budget-s 170 --json $OUT/mlp.json"
  [profile]="timeout 200 python3 -m parallel_mlp.bench profile && timeout 150 python3 -m parallel_mlp.bench profile --h 7168 && timeout 60 python3 -m parallel_mlp.bench host"
  [cold]="timeout 120 python3 -m parallel_mlp.bench cold --json $OUT/cold.json"
  [clock]="timeout 120 python3 tools/clock_probe.py --h 7168 && timeout 150 python3 tools/clock_probe.py --h 14336"
  [retime]="for h in 14336 7168; do timeout 280 python3 -m parallel_mlp.bench configs --h \$h --also consumers=pingpong,tile_n=128 --also consumers=pingpong,tile_n=192; done"
  [narrow]="timeout 200 python3 tools/pytest_shards.py 14 -m gpu tests/kernels/test_tile_narrow_gpu.py; timeout 200 python3 -m parallel_mlp.bench configs --h 7168 --only fc1,dpost --also tile_n=160; timeout 120 python3 -m parallel_mlp.bench configs --h 14336 --only dpost --also tile_n=160"
  [streamk]="timeout 170 python3 tools/pytest_shards.py 12 -m gpu tests/kernels/test_stream_k_gpu.py; for h in 14336 7168; do timeout 150 python3 -m parallel_mlp.bench configs --h \$h --only fc2,dx,dW2,dW1 --also stream_k=1; done"
  [position]="timeout 200 python3 -m parallel_mlp.bench configs --h 14336 --only dpost,fc2,dx --also cache_hints=normal --also cache_hints=normal"
  [full]="timeout 570 python3 -m parallel_mlp.bench --budget-s 420 --json $OUT/bench.json"
  [ncu]="timeout 240 ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 5 --launch-count 5 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis python3 -m parallel_mlp.bench ncu-cases"
)
ORDER=(tests_kernels tests_layer tests_all prefetch epi16 tiles192 largek hints retime narrow streamk position bench_gemm sweep mlp profile cold clock full ncu)

steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
  echo "usage: bash tools/gpu_run.sh STEP [STEP ...] | --list; steps: ${ORDER[*]}" >&2
  exit 2
fi
if [ "${steps[0]}" = "--list" ]; then
  for s in "${ORDER[@]}"; do printf '%-10s %s\n' "$s" "${CMD[$s]}"; done
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
