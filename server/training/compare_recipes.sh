#!/bin/bash
# Run from the repository root: bash server/training/compare_recipes.sh NAME
# The training-recipe comparison (README, "Not yet measured"): every recipe at N=300 steps x 1024 tokens on the same feature store (resumable: rerun
# the same command to continue from runs/fit8/NAME/checkpoint.pt).
C="--target qwen2.5-coder-1.5b-instruct --features runs/features/qwen1.5b --width 384 --heads 6 --vocab 8192 --batch-tokens 1024 --threads 1 --eval-every 100 --eval-sequences 16 --save-every 25"
case "$1" in
 eagle) edgespec train fit --kind eagle $C --lr 1e-3 --steps 300 --out runs/fit8/eagle ;;
 eagle-hass-s1) edgespec train fit --kind eagle+hass $C --lr 1e-3 --steps 240 --out runs/fit8/eagle-hass-s1 ;;
 eagle-hass) edgespec train fit --kind eagle+hass $C --lr 3e-4 --steps 60 --init runs/fit8/eagle-hass-s1 --opt stage=2 --out runs/fit8/eagle-hass ;;
 eagle-coral) edgespec train fit --kind eagle+coral $C --lr 1e-3 --steps 300 --out runs/fit8/eagle-coral ;;
 moa) edgespec train fit --kind moa --tli 0 $C --lr 1e-3 --steps 300 --out runs/fit8/moa ;;
 moa-hass-s1) edgespec train fit --kind moa+hass --tli 0 $C --lr 1e-3 --steps 240 --out runs/fit8/moa-hass-s1 ;;
 moa-hass) edgespec train fit --kind moa+hass --tli 0 $C --lr 3e-4 --steps 60 --init runs/fit8/moa-hass-s1 --opt stage=2 --out runs/fit8/moa-hass ;;
 beagle-early) edgespec train fit --kind beagle --opt stage=early --opt block=4 $C --window 384 --lr 1e-3 --steps 216 --out runs/fit8/beagle-early ;;
 beagle) edgespec train fit --kind beagle --opt stage=late --opt block=4 --init runs/fit8/beagle-early $C --window 384 --lr 1e-3 --steps 84 --out runs/fit8/beagle ;;
 eagle-router|eagle-hass-router|eagle-coral-router)
   edgespec train fit --kind eagle+router --init runs/fit8/${1%-router} $C --lr 3e-3 --steps 100 --out runs/fit8/$1 ;;
 moa-router|moa-hass-router)
   edgespec train fit --kind moa+router --tli 0 --init runs/fit8/${1%-router} $C --lr 3e-3 --steps 100 --out runs/fit8/$1 ;;
 table)  # the validation table from the runs' cards (every stage of a recipe, in order)
   F=runs/fit8
   python -m edgespec.server.training.compare_table eagle=$F/eagle eagle+hass=$F/eagle-hass-s1+$F/eagle-hass \
     eagle+coral=$F/eagle-coral moa=$F/moa moa+hass=$F/moa-hass-s1+$F/moa-hass beagle=$F/beagle-early+$F/beagle \
     eagle+router=$F/eagle+$F/eagle-router eagle+hass+router=$F/eagle-hass-s1+$F/eagle-hass+$F/eagle-hass-router \
     moa+router=$F/moa+$F/moa-router ;;
 bench)  # tokens/s, tau and per-position acceptance of every trained drafter, with and without its router, one run
   F=runs/fit8
   edgespec bench drafting --humaneval 20 --mtbench 20 --max-tokens 16 --threads 2 --methods target \
     --learned EAGLE=$F/eagle --learned EAGLE+router=$F/eagle-router \
     --learned EAGLE+HASS=$F/eagle-hass --learned EAGLE+HASS+router=$F/eagle-hass-router \
     --learned EAGLE+CORAL=$F/eagle-coral --learned MoA=$F/moa --learned MoA+router=$F/moa-router \
     --learned MoA+HASS=$F/moa-hass --learned Beagle=$F/beagle --out runs/bench/recipes.json ;;
 *) echo "usage: $0 eagle|eagle-hass-s1|eagle-hass|eagle-coral|moa|moa-hass-s1|moa-hass|beagle-early|beagle|eagle-router|eagle-hass-router|eagle-coral-router|moa-router|moa-hass-router|table|bench"; exit 2 ;;
esac
