#!/usr/bin/env bash
# The committed CPU benchmarks of the emoji bundle. One torch thread per process,
# so the numbers do not depend on how busy the second core is. Each command resumes if interrupted.
set -euo pipefail
export OMP_NUM_THREADS=1
# The runs behind the current tables (goal, t2i, cspd, mar, mar-steps) write to docs/results/data/
# (tables: python scripts/results_tables.py); the earlier studies (main, batch1, trees, tree-sizes,
# successors, greedy and the sweeps) rewrite their archived records in docs/results/archive/.
out=docs/results/data
old=docs/results/archive
methods="ar,speculative:gamma=2,speculative:gamma=4"
methods+=",sjd:window=8:init=random,sjd:window=8:init=horizontal-repeat,sjd:window=8:init=vertical-repeat"
methods+=",sjd:window=8:init=horizontal-sample,sjd:window=8:init=vertical-sample,sjd:window=16:init=horizontal-sample"
methods+=",speculative:gamma=4:accept=lantern:k=50:delta=0.2,sjd:window=8:init=horizontal-sample:accept=lantern:k=50:delta=0.2"
trees="eagle:depth=5:top_k=8:total_tokens=24,adt:init=horizontal:total_tokens=24,adt:init=vertical:total_tokens=24,adt:init=random:total_tokens=24"
methods+=",$trees,eagle:depth=5:top_k=8:total_tokens=24:accept=lantern:k=50:delta=0.2,adt:init=horizontal:total_tokens=24:accept=lantern:k=50:delta=0.2"
case "${1:-main}" in
  main)   # batch 8, 64 images: every method, quality proxy, plots
    specvis bench --model emoji --methods "$methods" --num 64 --batch-size 8 \
      --json $old/emoji-cpu.json --md $old/emoji-cpu.md --plots $old/plots ;;
  batch1) # batch 1: the latency case
    specvis bench --model emoji --methods "ar,speculative:gamma=2,speculative:gamma=4,sjd:window=4:init=horizontal-sample,sjd:window=8:init=horizontal-sample,sjd:window=16:init=horizontal-sample,sjd:window=8:init=random,sjd:window=8:init=horizontal-repeat,sjd:window=8:init=vertical-repeat,sjd:window=8:init=vertical-sample" \
      --num 8 --batch-size 1 --json $old/emoji-cpu-b1.json --md $old/emoji-cpu-b1.md ;;
  trees)  # ADT-Tree Table I on our model: batch 1 and 8, temperature 1 and 0
    for t in 1 0; do
      specvis bench --model emoji --methods "ar,speculative:gamma=4,$trees" --num 8 --batch-size 1 --temperature $t \
        --json $old/emoji-cpu-trees-b1-t$t.json --md $old/emoji-cpu-trees-b1-t$t.md
      specvis bench --model emoji --methods "ar,speculative:gamma=4,$trees" --num 16 --batch-size 8 --temperature $t \
        --json $old/emoji-cpu-trees-b8-t$t.json --md $old/emoji-cpu-trees-b8-t$t.md
    done ;;
  tree-sizes) # tree size (total_tokens) against CPU cost: batch 1, temperature 1
    sizes=""
    for n in 12 24 40 60; do sizes+=",eagle:depth=5:top_k=8:total_tokens=$n,adt:init=horizontal:total_tokens=$n"; done
    specvis bench --model emoji --methods "ar$sizes" --num 8 --batch-size 1 \
      --json $old/emoji-cpu-tree-sizes.json --md $old/emoji-cpu-tree-sizes.md ;;
  cspd)   # CSpD on the continuous emoji models: the paper's Table 1 (gamma 4/8/16/32, prefill 0.05) at
          # batch 1, 8 and 64; Table 4 (prefill 0/0.15 at gamma 8) and the exact ratios at batch 8;
          # then the ratio probe and the two-sample distance of each ratio's output law.
          # Run as "cspd 1", "cspd 8", "cspd 64", "cspd laws" (one core each). Sized for a CPU session:
          # a continuous token costs 25 head calls, so batch 1 and 8 run one batch without a warm-up
          # (at these sizes a warm-up sample costs as much as the measured batch).
    specs="ar,cspd:gamma=4,cspd:gamma=8,cspd:gamma=16,cspd:gamma=32"
    more=",cspd:gamma=8:prefill=0,cspd:gamma=8:prefill=0.15,cspd:gamma=4:ratio=trajectory,cspd:gamma=8:ratio=trajectory,cspd:gamma=4:ratio=coupled"
    case "${2:-1}" in
      1)  num=1; warm=none ;;
      8)  num=8; warm=none; specs+=$more ;;
      64) num=64; warm=row ;;
      laws)
        python -m specvis.bench.cspd_probe --model emoji-continuous --out $out/emoji-cspd-probe.json
        python -m specvis.bench.two_sample --model emoji-continuous --num 64 --batch-size 64 --gamma 4 \
          --out $out/emoji-cspd-two-sample.json
        exit 0 ;;
    esac
    specvis bench --model emoji --methods "$specs" --num $num --batch-size $2 --warmup $warm \
      --json $out/emoji-cspd-b$2.json --md $out/emoji-cspd-b$2.md ;;
  mar)    # CSpD on the emoji MAR pair (sv.load("emoji-mar")), the structure of paper 000's Table 1: gamma 4/8/16/32
          # for the paper ratio and the two exact ones, against MAR's own sampler (64 steps), batch 1 (8 images),
          # 8 or 64 (one batch each): "mar 1", "mar 8", "mar 64", one core each (CORE=); then
          # python scripts/cspd_mar_table.py docs/results/emoji-mar-cpu.md
    specs="ar"
    for r in paper coupled trajectory; do for g in 4 8 16 32; do specs+=",cspd:gamma=$g:ratio=$r"; done; done
    num=$2; [ "$2" = 1 ] && num=8
    taskset -c "${CORE:-0}" specvis bench --model emoji-mar --methods "$specs" --num $num --batch-size $2 \
      --warmup row --no-cost-curve --json $out/emoji-mar-b$2.json --md $out/emoji-mar-b$2.md ;;
  mar-steps) # MAR's own sampler with as few steps as CSpD's target forwards at gamma 4/8/16/32 (20, 12, 8, 6),
             # batch 64: the schedule coarsening that CSpD's block verification implies, without a draft
    for n in 20 12 8 6; do
      taskset -c "${CORE:-0}" specvis bench --model emoji-mar --methods ar --num 64 --batch-size 64 --num-iter $n \
        --warmup row --no-cost-curve --json $out/emoji-mar-b64-iter$n.json
    done ;;
  goal)   # issue 17's goals on the bundle after distillation: batch 1, 8 (the lossless methods and auto) or 64
          # (auto against AR), 64 images, 3 timed passes interleaved batch by batch across methods, seed 4242 (no
          # other table uses it), the cost curve sampled during the passes (predicted speedup, efficiency): "goal 1",
          # "goal 8", "goal 64", one core each (CORE=); REPEATS=5 reruns add two rounds to a finished run;
          # DTYPE=bf16 runs the bundle in bf16 (emoji-goal-bf16-b*.json); SUFFIX=-zen5 names a run on another CPU
          # (emoji-goal-b*-zen5.json)
    specs="ar,auto"
    [ "$2" != 64 ] && specs+=",sjd:window=16:init=vertical-sample:coupling=gumbel,sjd:window=12:init=vertical-sample:coupling=gumbel,sjd:window=8:init=vertical-sample:coupling=gumbel,speculative:gamma=4,static-tree:tree=chain"
    dtype=${DTYPE:-fp32}; name=emoji-goal-b$2; [ "$dtype" != fp32 ] && name=emoji-goal-$dtype-b$2
    name+=${SUFFIX:-}
    taskset -c "${CORE:-0}" specvis bench --model emoji --methods "$specs" --num 64 --batch-size $2 --seed 4242 \
      --dtype "$dtype" --repeats ${REPEATS:-3} --json $out/$name.json --md $out/$name.md ;;
  successors) # the SJD successors (MC-SJD coupling, GSD, StaticTree, LANTERN++) at batch 1 or 8 ("successors 1",
              # "successors 8": one core each), 64 images, seed 777 (no other table uses it); batch 1 has one
              # timed repeat (64 one-image batches), batch 8 three
    specs="ar"
    for w in 4 8 16; do for c in none maximal gumbel; do specs+=",sjd:window=$w:init=vertical-sample:coupling=$c"; done; done
    for g in 3 8 16; do specs+=",sjd:window=16:init=vertical-sample:coupling=none:accept=gsd:group=$g"; done
    specs+=",sjd:window=16:init=vertical-sample:coupling=maximal:accept=gsd:group=8"
    for g in 3 8; do specs+=",speculative:gamma=4:accept=gsd:group=$g"; done
    specs+=",static-tree:tree=chain,eagle:depth=5:top_k=8:total_tokens=6"
    specs+=",static-tree:tree=mc_sim_7b_63,eagle:depth=5:top_k=8:total_tokens=26"
    specs+=",static-tree:tree=mc_sim_7b_63:accept=lantern:budget=relative:k=10:lam=5"
    specs+=",static-tree:tree=mc_sim_7b_63:accept=lantern:k=50:delta=0.2,eagle:depth=5:top_k=8:total_tokens=26:accept=lantern:k=50:delta=0.2"
    repeats=3; [ "${2:-1}" = 1 ] && repeats=1
    taskset -c "${CORE:-0}" specvis bench --model emoji --methods "$specs" --num 64 --batch-size "${2:-1}" --seed 777 \
      --repeats $repeats --json $old/emoji-successors-b${2:-1}.json --md $old/emoji-successors-b${2:-1}.md ;;
  t2i)    # the text-to-image emoji bundle (emoji-t2i, Janus-Pro format): every method on the 64 prompts of
          # docs/results/data/emoji-t2i-prompts.txt (training glyph names spread over the 11 classes), seed 777,
          # batch 1 ("t2i 1") or 8 ("t2i 8"), one timed repeat each, one core each (CORE=)
    specs="ar,speculative:gamma=2,speculative:gamma=4,sjd:window=8:init=vertical-sample:coupling=none"
    specs+=",sjd:window=16:init=vertical-sample:coupling=gumbel,eagle:depth=5:top_k=8:total_tokens=12"
    specs+=",adt:init=horizontal:total_tokens=12,static-tree:tree=chain,static-tree:tree=mc_sim_7b_63"
    specs+=",speculative:gamma=4:accept=lantern:k=50:delta=0.2,sjd:window=16:init=vertical-sample:coupling=gumbel:accept=gsd:group=8"
    specs+=",static-tree:tree=mc_sim_7b_63:accept=lantern:budget=relative:k=10:lam=5"
    taskset -c "${CORE:-0}" specvis bench --model emoji-t2i --prompts docs/results/data/emoji-t2i-prompts.txt \
      --methods "$specs" --num 64 --batch-size "${2:-1}" --seed 777 --repeats 1 \
      --json $out/emoji-t2i-b${2:-1}.json --md $out/emoji-t2i-b${2:-1}.md ;;
  t2i-2d) # issue 48: ZipAR and PJD against AR, SJD (gumbel, w16) and GSD on the 64 emoji-t2i prompts, seed 777,
          # batch 1 or 8 ("t2i-2d 1", "t2i-2d 8"), the model's sampling (T = 1) or greedy ("t2i-2d 1 0"),
          # one timed repeat, one core (CORE=); the archived count-only study: docs/results/archive/rows2d_steps.py
    specs="ar,sjd:window=16:init=vertical-sample:coupling=gumbel,sjd:window=16:init=vertical-sample:coupling=gumbel:accept=gsd:group=8"
    specs+=",zipar:window=4,zipar:window=8,pjd,pjd:init=vertical-repeat,pjd:window=16:lag=4:init=vertical-repeat"
    t=${3:-1}
    taskset -c "${CORE:-0}" specvis bench --model emoji-t2i --prompts docs/results/data/emoji-t2i-prompts.txt \
      --methods "$specs" --num 64 --batch-size "${2:-1}" --seed 777 --repeats 1 --temperature "$t" \
      --json $old/emoji-t2i-2d-b${2:-1}-t$t.json --md $old/emoji-t2i-2d-b${2:-1}-t$t.md ;;
  rows2d) # issue 48's benchmark pages (docs/results/rows2d-emoji-t2i.md, rows2d-emoji.md): AR, SJD (gumbel, w16),
          # GSD, ZipAR (window 2, 4) and PJD (three settings) on emoji-t2i or emoji ("rows2d emoji-t2i", "rows2d emoji"),
          # seed 777, T = 1 at batch 1 and 8 (32 images each), greedy at batch 8 (16) and 1 (8), one timed pass,
          # row warm-up, no cost curve; then python scripts/rows2d_explore.py --prompts 8,
          # python scripts/rows2d_lumina_steps.py --prompts 16 and python scripts/results_tables.py
    model=${2:-emoji-t2i}; extra=""
    [ "$model" = emoji-t2i ] && extra="--prompts docs/results/data/emoji-t2i-prompts.txt"
    specs="ar,sjd:window=16:init=vertical-sample:coupling=gumbel,sjd:window=16:init=vertical-sample:coupling=gumbel:accept=gsd:group=8"
    specs+=",zipar:window=2,zipar:window=4,pjd:init=vertical-repeat,pjd:window=16:lag=4:init=vertical-repeat"
    specs+=",pjd:window=16:lag=4:init=vertical-repeat:accept=gsd:group=8"
    # at T = 1 both models also run the settings the count sweep (scripts/rows2d_explore.py) found for the goals
    # (the first, busy-machine runs added them later by resuming the JSON; a fresh run takes them in one pass)
    lantern="pjd:window=16:lag=4:init=vertical-repeat:accept=lantern:k=50"
    more=",zipar:window=1,$lantern:delta=0.2,$lantern:delta=0.05,$lantern:delta=0.1"
    [ "$model" = emoji-t2i ] && more+=",pjd:window=16:lag=2:init=vertical-repeat:accept=gsd:group=32:delta_p=0.5"
    # batch 8 is continuous batching (each method's images in one call through 8 rows); pinned to core CORE
    for tbn in "1 1 32" "1 8 32" "0 8 16" "0 1 8"; do
      set -- $tbn
      all=$specs; [ $1 = 1 ] && all+=$more
      cont=""; [ $2 = 8 ] && cont="--continuous"
      run=rows2d-$model-b$2-t$1  # LOADLOG=FILE: each run's start and end with /proc/loadavg (rows2d-load.json)
      if [ -n "${LOADLOG:-}" ]; then echo "$run start $(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOADLOG"; fi
      taskset -c "${CORE:-0}" specvis bench --model "$model" $extra --methods "$all" --num $3 --batch-size $2 $cont \
        --seed 777 --repeats 1 --temperature $1 --warmup row --no-cost-curve --json $out/$run.json --md $out/$run.md
      if [ -n "${LOADLOG:-}" ]; then echo "$run end $(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOADLOG"; fi
    done ;;
  rows2d-q64) # the quality check of rows2d-emoji-t2i.md: the settings nearest issue 48's goals, 64 images, batch 8, seed 4848
    specs="ar,sjd:window=16:init=vertical-sample:coupling=gumbel,pjd:window=16:lag=4:init=vertical-repeat:accept=gsd:group=8"
    specs+=",pjd:window=16:lag=2:init=vertical-repeat:accept=gsd:group=32:delta_p=0.5,zipar:window=1"
    specs+=",pjd:window=16:lag=4:init=vertical-repeat:accept=lantern:k=50:delta=0.2"
    specvis bench --model emoji-t2i --prompts docs/results/data/emoji-t2i-prompts.txt --methods "$specs" --num 64 --batch-size 8 \
      --seed 4848 --repeats 1 --temperature 1 --warmup row --no-cost-curve \
      --json $out/rows2d-emoji-t2i-b8-t1-q64.json --md $out/rows2d-emoji-t2i-b8-t1-q64.md ;;
  rows2d-q128) # issue 48's quality decision: AR, SJD (the equal-law noise reference) and the settings that reach the
               # step-compression goals (scripts/rows2d_explore.py --prompts 16 --specs ...), 128 images, batch 8,
               # seed 1280 (no other run uses it), 4 seed groups of 32 images; the batch-1 step compression of each
               # setting is scripts/rows2d_batch_tail.py's (the same 32 images as the rows2d batch-1 run)
    specs="ar,sjd:window=16:init=vertical-sample:coupling=gumbel"
    specs+=",pjd:window=16:lag=2:init=vertical-repeat:accept=gsd:group=32:delta_p=0.5"
    specs+=",pjd:window=16:lag=4:init=vertical-repeat:accept=lantern:k=50:delta=0.1,pjd:window=16:lag=1:init=vertical-repeat:accept=gsd:group=50"
    specs+=",pjd:window=16:lag=2:init=vertical-repeat:accept=gsd:group=50:delta_p=0.5,pjd:window=16:lag=1:init=vertical-repeat:accept=gsd:group=50:delta_p=0.3"
    specvis bench --model emoji-t2i --prompts docs/results/data/emoji-t2i-prompts.txt --methods "$specs" --num 128 --batch-size 8 \
      --seed 1280 --repeats 1 --temperature 1 --warmup row --no-cost-curve \
      --json $out/rows2d-emoji-t2i-b8-t1-q128.json --md $out/rows2d-emoji-t2i-b8-t1-q128.md ;;
  greedy) # temperature 0: Jacobi and greedy SJD against greedy AR
    specvis bench --model emoji --methods "ar,jacobi:window=8,jacobi:window=16,sjd:window=8:init=horizontal-sample,speculative:gamma=4" \
      --num 16 --batch-size 8 --temperature 0 --json $old/emoji-cpu-greedy.json --md $old/emoji-cpu-greedy.md ;;
  sjd-ablations|lantern-grid)
    python -m specvis.bench.sweeps "$1" --model emoji --out $old --num 16 --batch-size 8 ;;
  lantern-greedy) # the lantern-grid sweep at temperature 0: the paper's greedy rule on the soft law
    python -m specvis.bench.sweeps lantern-greedy --model emoji --out $old --num 16 --batch-size 8 ;;
esac
