#!/usr/bin/env bash
# Runs every fault-injection case N times (default 100) and counts the outcomes: a
# case passes when it ends with its error message; a hang (killed by the 60 s
# guard; 10 s for the default mode's cases with the default deadline) or a crash
# without the message is a failure. Not part of CI (it is long).
#   scripts/stress.sh [N]              after building build/ (scripts/test.sh does)
#   scripts/stress.sh N checkpoints    only the checkpoint cases (at the end)
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-100}
only=${2:-all}
bin=build/tests
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

inprocess=(
  "a rank that throws while the others wait in a collective*"
  "a rank that throws after a collective*"
  "a rank that throws in the middle of a redistribution*"
  "a rank that returns early*"
  "mismatched collectives and sizes*"
  "a collective that waits past the timeout*"
  "point-to-point: mismatched tags*"
  "from_local with a wrong local shape*"
)
declare -A mpi=(
  [throw]="dtensor: rank 1 failed: rank 1 gives up on purpose"
  [mismatch]="collective mismatch on a communicator of 3 ranks"
  [sizes]="rank 2 sends 1 elements to rank [012], which expects 2"
  [timeout]="all_reduce #1 timed out after 1 s"
  [early]="returned from its function"
)
# The default mode (no DTENSOR_CHECK_COLLECTIVES), 4 processes, the default deadline
# (120 s): the watchdogs, asking each other, end the job within 10 s.
declare -A mpi_default=(
  [early_default]="all_reduce #1 .4 elements, a communicator of 4 ranks. waits for rank 1 .world rank 1., which returned from its function"
  [stop_default]="rank 1 .world rank 1. has not answered for 3 s: stopped, or dead"
  [early_split_default]="waits for rank 1 .world rank 3., which returned from its function"
  [trust_sizes]="all_reduce #[0-9]+: rank [0-3] .*and rank [0-3] .*disagree on the element count .[45] and [45] elements."
)
# ... and, with DTENSOR_TIMEOUT_S=2 and 3 processes, what the deadline alone ends: a
# peer that computes (it answers), a program without MPI_THREAD_MULTIPLE.
declare -A mpi_deadline=(
  [slow_default]="all_reduce #1 .4 elements, a communicator of 3 ranks. has waited 2.[0-9] s for the other ranks"
  [early_funneled]="all_reduce #1 .4 elements, a communicator of 3 ranks. has waited 2.[0-9] s for the other ranks"
)

printf "| case | runs | ok | hangs | other failures |\n|---|---|---|---|---|\n"
[[ $only == checkpoints ]] && inprocess=() && unset 'mpi[@]' 'mpi_default[@]' 'mpi_deadline[@]' &&
  declare -A mpi=() mpi_default=() mpi_deadline=()
for tc in "${inprocess[@]}"; do
  ok=0 hang=0 bad=0
  for ((i = 0; i < n; ++i)); do
    timeout 60 "$bin/test_faults" -tc="$tc" > /dev/null 2>&1
    case $? in 0) ((ok++)) ;; 124) ((hang++)) ;; *) ((bad++)) ;; esac
  done
  printf "| in-process: %s | %d | %d | %d | %d |\n" "${tc%\*}" "$n" "$ok" "$hang" "$bad"
done
# One MPI fault case n times: mpi_case LABEL PROCESSES GUARD_S MODE REGEX ENV...
mpi_case() {
  local label=$1 np=$2 guard=$3 mode=$4 regex=$5 out rc ok=0 hang=0 bad=0
  shift 5
  for ((i = 0; i < n; ++i)); do
    out=$(env "$@" timeout "$guard" mpiexec -n "$np" "$bin/mpi_rank_failure" "$mode" 2>&1 < /dev/null)
    rc=$?
    if [[ $rc == 124 ]]; then ((hang++))
    elif grep -Eq "$regex" <<< "$out" && ! grep -q "not reached" <<< "$out"; then ((ok++))
    else ((bad++)); fi
  done
  printf "| MPI (%d processes%s): %s | %d | %d | %d | %d |\n" "$np" "$label" "$mode" "$n" "$ok" "$hang" "$bad"
}
if [[ -x $bin/mpi_rank_failure ]]; then
  for mode in "${!mpi[@]}"; do
    mpi_case "" 3 60 "$mode" "${mpi[$mode]}" DTENSOR_CHECK_COLLECTIVES=1 DTENSOR_TIMEOUT_S=1
  done
  for mode in "${!mpi_default[@]}"; do
    mpi_case ", default mode, ended within 10 s" 4 10 "$mode" "${mpi_default[$mode]}" -u DTENSOR_TIMEOUT_S \
      -u DTENSOR_CHECK_COLLECTIVES
  done
  for mode in "${!mpi_deadline[@]}"; do
    mpi_case ", default mode" 3 60 "$mode" "${mpi_deadline[$mode]}" -u DTENSOR_CHECK_COLLECTIVES DTENSOR_TIMEOUT_S=2
  done
fi

# Checkpoints (issue 39), across processes: a loading job (2 processes) while a
# saving job (3 processes) replaces the checkpoint again and again: every load reads
# one save whole or says it changed (checkpoint_stress exits 1 on anything else);
# then saving jobs killed by SIGKILL at random moments, n / 5 times: the next save
# leaves no temporary directory behind.
if [[ -x $bin/checkpoint_stress ]]; then
  ck=$(mktemp -d)/ck
  mpiexec -n 3 "$bin/checkpoint_stress" once "$ck" 0 > /dev/null 2>&1 < /dev/null
  rounds=$(( n / 20 > 0 ? n / 20 : 1 )) ok=0 bad=0
  for ((i = 0; i < rounds; ++i)); do
    mpiexec -n 3 "$bin/checkpoint_stress" save "$ck" 5 > /dev/null 2>&1 < /dev/null &
    saver=$!
    if out=$(timeout 60 mpiexec -n 2 "$bin/checkpoint_stress" load "$ck" 4 2>&1 < /dev/null); then ((ok++))
    else ((bad++)); echo "$out" | tail -3; fi
    wait $saver
  done
  printf "| checkpoints: a load during saves (2 and 3 processes, 4 s each) | %d | %d | 0 | %d |\n" "$rounds" "$ok" "$bad"
  kills=$(( n / 5 > 0 ? n / 5 : 1 )) left=0 most=0
  for ((i = 0; i < kills; ++i)); do
    mpiexec -n 3 "$bin/checkpoint_stress" save "$ck" 30 > /dev/null 2>&1 < /dev/null &
    sleep "1.$((RANDOM % 9 + 1))"  # past MPI's start, into the saves
    pkill -KILL -f "^$bin/checkpoint_stress save $ck"  # the processes, not mpiexec: it then ends the job
    wait $! 2> /dev/null
    now=$(find "$(dirname "$ck")" -maxdepth 1 -name 'ck.tmp-*' | wc -l)
    ((now > 0)) && ((left++)); ((now > most)) && most=$now
  done
  mpiexec -n 3 "$bin/checkpoint_stress" once "$ck" 1 > /dev/null 2>&1 < /dev/null
  after=$(find "$(dirname "$ck")" -maxdepth 1 -name 'ck.tmp-*' | wc -l)
  printf "| checkpoints: saves killed with SIGKILL (%d), then one save | %d | %d | 0 | %d |\n" "$kills" "$kills" \
    "$((after == 0 ? kills : 0))" "$((after == 0 ? 0 : kills))"
  echo "(kills that left a temporary directory: $left of $kills; at most $most at once; after the next save: $after)"
  rm -rf "$(dirname "$ck")"
fi
