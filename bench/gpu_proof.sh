#!/usr/bin/env bash
# The GPU proof (issue 35): plait's runtime right, fast and calibrated on one GPU, in one command.
#
#   bash bench/gpu_proof.sh [--dry-run] [--out DIR] [--gpu SPEC] [--only STEP,STEP]
#
# Runs every step of bench/gpu_proof.py (the step table and its limits live there: `python
# bench/gpu_proof.py steps`) under coreutils `timeout`: SIGTERM 5 s before the step's limit, SIGKILL
# at it, so a failing or hanging step is reported and the others still run. The limits add up to
# 560 s (9 min 20 s on an H100, set-up included). Nothing comes from the network: plait runs from
# this tree (PYTHONPATH=src); wheels carried in bench/wheels/ are installed with pip --no-index
# by the setup step, only if that folder exists. Results go to $OUT (default
# bench/results/gpu_proof): steps/STEP.json, logs/STEP.log, summary.md, summary.json.
#
#   --dry-run   the same steps on the CPU with a tiny model, in seconds (the test suite runs it;
#               steps that need CUDA say "skipped: no GPU"); all in one process, each under
#               SIGALRM at its limit (x3: a shared CPU is slow), to import torch once
#   --only      run only these steps (then the summary of everything in $OUT)
# Exit status: 0 when no step failed or timed out, 1 otherwise, 2 for bad arguments.
set -u
CALLER="$PWD"
cd "$(dirname "$0")/.." || exit 2
ROOT="$PWD"
DRY=()
GPU=()
ONLY=""
OUT_DIR="${OUT:-$ROOT/bench/results/gpu_proof}"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=(--dry-run) ;;
        --out) [ $# -ge 2 ] || { echo "gpu_proof.sh: --out needs a folder" >&2; exit 2; }; OUT_DIR="$2"; shift ;;
        --gpu) [ $# -ge 2 ] || { echo "gpu_proof.sh: --gpu needs a GPU spec (e.g. h100-sxm)" >&2; exit 2; }; GPU=(--gpu "$2"); shift ;;
        --only) [ $# -ge 2 ] || { echo "gpu_proof.sh: --only needs step names (e.g. right,fast)" >&2; exit 2; }; ONLY="$2"; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu_proof.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done
command -v timeout >/dev/null || { echo "gpu_proof.sh: needs coreutils timeout" >&2; exit 2; }
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# compiled kernels are reused across steps (outside $OUT: they are not results)
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/plait-gpu-proof-inductor}"
case "$OUT_DIR" in /*) ;; *) OUT_DIR="$CALLER/$OUT_DIR" ;; esac  # relative to where it was called
mkdir -p "$OUT_DIR/steps" "$OUT_DIR/logs" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

STEPS="$("$PYTHON" bench/gpu_proof.py steps)" || exit 2  # GPU_PROOF_LIMITS="fast=200" changes a limit
if [ -n "$ONLY" ]; then
    for name in ${ONLY//,/ }; do
        grep -q "^$name " <<<"$STEPS" || { echo "gpu_proof.sh: --only: no step '$name'" >&2; exit 2; }
    done
fi
TOTAL=0
echo "GPU proof${DRY:+ (dry run)}: results in $OUT_DIR"
while read -r name limit what; do
    printf '  %-14s %4s s  %s\n' "$name" "$limit" "$what"
    TOTAL=$((TOTAL + limit))
done <<<"$STEPS"
echo "  limits add up to $TOTAL s, set-up included"
WHEELS=(bench/wheels/*.whl)
if [ -e "${WHEELS[0]}" ]; then
    echo "  carried wheels (setup installs them${DRY:+; not in a dry run}): ${WHEELS[*]##*/}"
elif "$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torchao") is None)'; then
    echo "  no wheels in bench/wheels/: nothing to install (torchao is installed)"
else
    echo "  no wheels in bench/wheels/ and no torchao: the fp8 checks will say 'skipped' (docs/benchmarks.md: pip download)"
fi
if [ -n "${DRY:-}" ]; then  # the dry run's own limits (a shared CPU is slow)
    STEPS="$("$PYTHON" bench/gpu_proof.py steps --dry-run)" || exit 2
    echo "  dry run: limits $(awk '{ printf "%s%s=%s", sep, $1, $2; sep = " " }' <<<"$STEPS") s"
fi

SELECTED=()
DRY_TOTAL=0
while read -r name limit what; do
    [ "$name" = summary ] && continue
    if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then
        continue
    fi
    rm -f "$OUT_DIR/steps/$name.json" "$OUT_DIR/steps/$name.rc"
    SELECTED+=("$name")
    DRY_TOTAL=$((DRY_TOTAL + limit))
    [ -n "${DRY:-}" ] && continue  # below: every step in one process (one import of torch)
    start=$(date +%s.%N)
    timeout --kill-after=5 "$((limit - 5))" "$PYTHON" bench/gpu_proof.py run "$name" --out "$OUT_DIR" \
        ${GPU[@]+"${GPU[@]}"} >"$OUT_DIR/logs/$name.log" 2>&1
    rc=$?
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "$rc $took" >"$OUT_DIR/steps/$name.rc"
    case $rc in
        0) word=ok ;; 124) word=TIMEOUT ;; 137) word="KILLED (timeout)" ;; *) word="FAILED (exit $rc)" ;;
    esac
    printf '%-14s %s after %s s (limit %s s; log %s)\n' "$name" "$word" "$took" "$limit" "logs/$name.log"
done <<<"$STEPS"
if [ -n "${DRY:-}" ] && [ ${#SELECTED[@]} -gt 0 ]; then
    # the dry run: the same steps in one process, each under SIGALRM at its limit (gpu_proof.py run_in_process)
    timeout --kill-after=5 "$DRY_TOTAL" "$PYTHON" bench/gpu_proof.py run "${SELECTED[@]}" --dry-run \
        --out "$OUT_DIR" ${GPU[@]+"${GPU[@]}"} 2>"$OUT_DIR/logs/dry_run.log"
fi

summary_limit=$(awk '$1 == "summary" { print $2 }' <<<"$STEPS")
timeout --kill-after=2 "$((summary_limit - 2))" "$PYTHON" bench/gpu_proof.py summary --out "$OUT_DIR" ${DRY[@]+"${DRY[@]}"}
