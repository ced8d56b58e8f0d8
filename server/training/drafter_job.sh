#!/usr/bin/env bash
# The learned drafters' long run as one resumable background job: every step below is an `edgespec train`
# command that continues where it stopped, so a killed job (a reboot, a session's end) is started again with
# the same command and loses at most one shard or one batch of answers. A fit stopped with `kill PID` (SIGTERM
# on its `edgespec train fit` process) loses nothing: it finishes the step under way and writes its card.
#
#   server/training/drafter_job.sh text      raw code and docs -> a hidden-only feature store (EAGLE's bulk)
#   server/training/drafter_job.sh answers   client-form requests answered by the target -> samples.jsonl, and
#                                            the features of each answer as it is written -> a full store
#   server/training/drafter_job.sh answers-features   answers written before features were kept -> a hidden store
#   server/training/drafter_job.sh answers-full       the same answers -> a full store (all K/V: MoA's)
#   server/training/drafter_job.sh eagle     fit the EAGLE head on the answers' and the text's stores
#   server/training/drafter_job.sh eagle-hass    the same head and stores with HASS's unrolled, detached steps
#   server/training/drafter_job.sh moa N     fit MoA with TLI N (0 or 1) on the full store
#   server/training/drafter_job.sh moa-hass N    the same drafter and stores with HASS's unrolled steps
#   server/training/drafter_job.sh cool STEPS eagle|eagle-hass|moa N|moa-hass N
#                                            a cooldown: branch that fit's run as it stands now into its own
#                                            folder (fit/RUN-coolSTEPS-fromSTEP) and bring the learning rate
#                                            linearly to 0 over STEPS more steps; the steady run is left as it is
#                                            (COOL_KIND=eagle+hass, or moa+hass: cool the run under another recipe
#                                            of the same drafter, to fit/RUN-coolSTEPS-fromSTEP-eagle-hass)
#
# Each step runs on one thread: on a 2-core machine two steps side by side go faster than one on both
# cores (a 2-thread forward waits on the busier core). Settings come from the environment:
set -euo pipefail

TARGET=${TARGET:-qwen2.5-coder-1.5b-instruct}
OUT=${OUT:-${EDGESPEC_HOME:-$HOME/.cache/edgespec}/train}  # beside the model cache, outside any git tree
DTYPE=${DTYPE:-}                  # empty: bf16 where the CPU has it natively, else float32
THREADS=${THREADS:-1}
TEXT=${TEXT:-"$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') /usr/share/doc"}
TEXT_TOKENS=${TEXT_TOKENS:-3000000}
N_COMPLETE=${N_COMPLETE:-3000} N_CHAT=${N_CHAT:-3000} N_WRITE=${N_WRITE:-400} N_EXPLAIN=${N_EXPLAIN:-200}
MAX_NEW=${MAX_NEW:-256} BATCH=${BATCH:-32}
SEED=${SEED:-0}                   # chooses the requests: another seed, requests the drafters have not trained on
ANSWERS=${ANSWERS:-answers}       # names an answers set: data-$ANSWERS and store-$ANSWERS-live; a second set (say
                                  # ANSWERS=answers-s2 SEED=2) answers beside the first on the other core
STORES=${STORES:-}                # the fits' stores, space-separated; empty: every answers store (and, for EAGLE, the text's)
MAX_LEN=${MAX_LEN:-1024}
WIDTH=${WIDTH:-768} HEADS=${HEADS:-12} VOCAB=${VOCAB:-32768}
STEPS=${STEPS:-20000} BATCH_TOKENS=${BATCH_TOKENS:-4096} LR=${LR:-1e-3} MINUTES=${MINUTES:-0}
EVAL_EVERY=${EVAL_EVERY:-100} EVAL_SEQUENCES=${EVAL_SEQUENCES:-8} SAVE_EVERY=${SAVE_EVERY:-10}
SNAPSHOT_TOKENS=${SNAPSHOT_TOKENS:-131072}  # a drafter kept at 131k, 262k, 524k, ... tokens seen: the scaling curve
AMP=${AMP:-bf16}                  # bf16 autocast: 1.7x float32's training tokens/s on a CPU with AVX512-BF16
CACHE_MB=${CACHE_MB:-4096}        # MiB of decoded sequences the fits keep in memory (1024 for MoA beside other jobs)
INIT=${INIT:-}                    # a fit's warm start: a run folder or a drafter (shared/drafters/checkpoints/eagle);
                                  # read at the run's first start only, a resume goes on from its checkpoint
OPTS=${OPTS:-}                    # the recipe's settings, space-separated KEY=VALUE (--opt each): OPTS=stage=2 is
                                  # HASS's second stage (with INIT a stage-1 run or drafter)
RUN=${RUN:-}                      # the fit's folder under fit/ (default: the recipe and width, e.g. eagle-hass-w768)
common=(--target "$TARGET" --threads "$THREADS" ${DTYPE:+--dtype "$DTYPE"})
opts=(); for o in $OPTS; do opts+=(--opt "$o"); done

LIVE="$OUT/store-$ANSWERS-live"  # the answers' features, kept as the target writes them
# Rows answered before the live store began: the only ones `train features` still needs (empty: no live store).
before_live() {
  [ -f "$LIVE/store.json" ] || return 0
  python -c 'import json, sys; print(json.load(open(sys.argv[1]))["capture"]["first_row"])' "$LIVE/store.json"
}

text_args=()
for t in $TEXT; do text_args+=(--text "$t"); done

# A cooldown runs the named fit's own step with these arguments added and its run folder replaced.
fit_extra=() fit_out="" recipe=""
if [ "${1:-}" = cool ]; then
  cool_steps=${2:?cool needs the cooldown steps and a fit: cool STEPS eagle|eagle-hass|moa N|moa-hass N}
  shift 2
  case "${1:-}" in
    moa|moa-hass) src_name=${RUN:-$1-tli${2:?$1 needs the TLI depth}-w$WIDTH} ;;
    *) src_name=${RUN:-${1:?cool needs a fit}-w$WIDTH} ;;
  esac
  src="$OUT/fit/$src_name"
  from=$(python -c 'import sys, torch; print(torch.load(sys.argv[1], weights_only=False, mmap=True)["step"])' \
         "$src/checkpoint.pt")
  fit_out="$OUT/fit/$src_name-cool$cool_steps-from$from${COOL_KIND:+-${COOL_KIND/+/-}}"
  fit_extra=(--branch-from "$src" --cooldown "$cool_steps")
  recipe=${COOL_KIND:-}  # another recipe of the same drafter for the branch (its folder says which)
  SNAPSHOT_TOKENS=0  # a cooled branch is not a point of the steady run's scaling curve
fi

case "${1:-}" in
  text)
    edgespec train data "${common[@]}" --out "$OUT/data-text" "${text_args[@]}" --chunk-tokens "$MAX_LEN" \
        --chunks-per-file 2 --max-tokens "$TEXT_TOKENS" --val-fraction 0.01 --val-first 16
    edgespec train features "${common[@]}" --data "$OUT/data-text" --out "$OUT/store-text-hidden" --contents hidden \
        --max-len "$MAX_LEN" --batch-tokens $((2 * MAX_LEN)) --shard-tokens 16384 ;;
  answers)
    edgespec train data "${common[@]}" --out "$OUT/data-$ANSWERS" --n-write "$N_WRITE" --n-explain "$N_EXPLAIN" \
        --n-code 0 --seed "$SEED" --n-complete "$N_COMPLETE" --n-chat "$N_CHAT" --max-new-tokens "$MAX_NEW" --batch-size "$BATCH" \
        --val-fraction 0.02 --features-out "$LIVE" --features-contents full --features-tli 0,1 ;;
  answers-features|answers-full)
    # Only the rows answered before the live store began. With no live store the answers may still be
    # coming (the `answers` step beside): --growing, and the last, unfilled shard waits for a later run.
    first=$(before_live)
    if [ "$first" = 0 ]; then echo "every answer has its features in $LIVE: nothing to extract"; exit 0; fi
    if [ "$1" = answers-full ]; then store=(--out "$OUT/store-answers-full" --contents full --tli 0,1)
    else store=(--out "$OUT/store-answers-hidden" --contents hidden); fi
    edgespec train features "${common[@]}" --data "$OUT/data-$ANSWERS" "${store[@]}" --max-len $((2 * MAX_LEN)) \
        --batch-tokens $((2 * MAX_LEN)) --shard-tokens 16384 \
        $([ -n "$first" ] && echo --limit "$first" || echo "${GROWING---growing}") ;;
  moa|moa-hass)
    tli=${2:?$1 needs the TLI depth: 0 or 1}
    stores=()
    for s in ${STORES:-"$OUT/store-answers-full" "$OUT"/store-*-live}; do
      [ -f "$s/store.json" ] && stores+=(--features "$s")
    done
    # glibc raises its mmap threshold as large blocks are freed, so a step's freed activations (tens of MB) stay
    # in the heap and fragment it: MoA's resident memory crept from ~10 GB to 15 GB over 100 steps until the
    # kernel killed it. A fixed 4 MiB threshold hands them back: its peaks stay at ~10 GB (~20 % fewer tokens/s).
    MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-4194304} edgespec train fit "${common[@]}" --kind "${recipe:-${1/-/+}}" "${opts[@]}" --tli "$tli" "${stores[@]}" \
        --out "${fit_out:-$OUT/fit/${RUN:-$1-tli$tli-w$WIDTH}}" "${fit_extra[@]}" --width "$WIDTH" --heads "$HEADS" --vocab "$VOCAB" \
        --batch-tokens "$BATCH_TOKENS" --lr "$LR" --steps "$STEPS" --max-minutes "$MINUTES" \
        --eval-every "$EVAL_EVERY" --eval-sequences "$EVAL_SEQUENCES" --save-every "$SAVE_EVERY" --amp "$AMP" \
        --snapshot-tokens "$SNAPSHOT_TOKENS" --cache-mb "$CACHE_MB" ${INIT:+--init "$INIT"} ;;
  eagle|eagle-hass)
    kind=${recipe:-${1/-/+}}  # eagle, eagle+hass: the recipe; its run folder keeps the dash
    stores=()
    for s in ${STORES:-"$OUT/store-answers-hidden" "$OUT"/store-*-live "$OUT/store-text-hidden"}; do
      [ -f "$s/store.json" ] && stores+=(--features "$s")
    done
    # the same fixed mmap threshold as MoA's (above): EAGLE beside MoA crept from 9.9 to 13.1 GB in 33 minutes;
    # resumed with it and CACHE_MB=1024 it held at about 7 GB (EAGLE+HASS still crept past 10 GB with both)
    MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-4194304} edgespec train fit "${common[@]}" --kind "$kind" "${opts[@]}" "${stores[@]}" --out "${fit_out:-$OUT/fit/${RUN:-$1-w$WIDTH}}" "${fit_extra[@]}" \
        --width "$WIDTH" --heads "$HEADS" --vocab "$VOCAB" --batch-tokens "$BATCH_TOKENS" --lr "$LR" \
        --steps "$STEPS" --max-minutes "$MINUTES" --eval-every "$EVAL_EVERY" --eval-sequences "$EVAL_SEQUENCES" \
        --save-every "$SAVE_EVERY" --amp "$AMP" --snapshot-tokens "$SNAPSHOT_TOKENS" --cache-mb "$CACHE_MB" ${INIT:+--init "$INIT"} ;;
  *)
    awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2 ;;  # the header comment above
esac
