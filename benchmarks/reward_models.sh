#!/usr/bin/env bash
# The reward-model figures, end to end: a policy with written-out steps, preference pairs and step labels it generates,
# outcome (Bradley-Terry) and process reward models on MiniLM and on the tiny backbone, and their evaluation.
#
#     bash benchmarks/reward_models.sh [OUT]        # default OUT=runs/rm_bench; 76 min measured on 2 cores
#
# Every stage is a plain `rewardlab` command (shown below with its settings) writing its own run directory under
# OUT; a stage whose summary.json exists is skipped and a stopped one is resumed (--resume), so a stopped run
# resumes where it stopped. Threads are pinned to 1 (OMP_NUM_THREADS=1) for repeatability. Run it from the
# repository root after `make install` (or with
# `rewardlab` on PATH). The last step prints the table that the README and docs/reward-models.md quote.
#
# Task: reasoning-gym chain_sum with 3-5 one-digit terms, worked as partial sums one per line (`worked:chain_sum`,
# the preset of `reasoning_gym:chain_sum` with `target: steps`); 20,000 draws, 500 held-out questions.
set -euo pipefail

OUT=${1:-runs/rm_bench}
VENV_BIN=$( [[ -x .venv/bin/rewardlab ]] && echo .venv/bin/ || true )   # the repo's venv (make install), else PATH
RL=${RL:-${VENV_BIN}rewardlab}
PYTHON=${PYTHON:-$( [[ -n $VENV_BIN ]] && echo ${VENV_BIN}python || echo python3 )}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
TASK=(--task worked:chain_sum
      "task.options={min_terms: 3, max_terms: 5, min_digits: 1, max_digits: 1, size: 20000, test_size: 500}")
mkdir -p "$OUT"

stage() {  # stage NAME COMMAND...: run COMMAND unless OUT/NAME/summary.json exists; resume one that was stopped
  local name=$1; shift
  if [[ -f "$OUT/$name/summary.json" ]]; then echo "== $name: done before, skipped"; return; fi
  local again=()
  if [[ -f "$OUT/$name/events.jsonl" ]]; then again=(--resume); fi  # a stopped stage continues where it stopped
  echo "== $name: $* ${again[*]}"
  local t0=$SECONDS
  "$@" --no-progress "${again[@]}" --out "$OUT/$name" >> "$OUT/$name.log" 2>&1 \
    || { echo "stage $name failed; see $OUT/$name.log"; exit 1; }
  echo "   $((SECONDS - t0)) s"
}
last_ckpt() { ls -d "$OUT/$1"/checkpoints/step-* | sort -V | tail -1; }

# 1. Policies. A weak one (800 SFT steps from fresh weights) and a stronger one (1,200 more steps), which makes the
#    preference pairs and the step labels and is the PRM/ORM backbone.
stage sft_a   $RL sft --model tiny "${TASK[@]}" --seed 0 sft.steps=800 sft.lr=3e-3 sft.batch_size=64
stage sft_b   $RL sft --model "$(last_ckpt sft_a)" "${TASK[@]}" --seed 1 sft.steps=1200 sft.lr=1.5e-3 sft.batch_size=64
stage eval_sft_a $RL evaluate --model "$(last_ckpt sft_a)" "${TASK[@]}" eval.max_new_tokens=40
stage eval_sft_b $RL evaluate --model "$(last_ckpt sft_b)" "${TASK[@]}" eval.max_new_tokens=40

# 2. Preference pairs (rm pairs) from policy B: 8 samples per question at T=1, a correct and an incorrect completion
#    of the same question paired (at most 2 pairs per question), from 4,000 training questions; all 500 test
#    questions for the held-out pairs.
stage pairs_train $RL rm pairs --model "$(last_ckpt sft_b)" "${TASK[@]}" split=train pairs.n=8 pairs.limit=4000 \
  pairs.max_new_tokens=40
stage pairs_test  $RL rm pairs --model "$(last_ckpt sft_b)" "${TASK[@]}" split=test pairs.n=8 pairs.max_new_tokens=40

# 3. MiniLM Bradley-Terry reward model on those pairs, evaluated on the held-out ones.
stage bt_minilm $RL rm train --model minilm --data "$OUT/pairs_train/pairs.jsonl" eval_data="$OUT/pairs_test/pairs.jsonl" \
  train.epochs=2 train.batch_size=32 train.lr=5e-5 train.eval_every=50
stage eval_bt_minilm_pairs $RL rm eval --model "$(last_ckpt bt_minilm)" --data "$OUT/pairs_test/pairs.jsonl"

# 3b. The same from the weak policy A (6,000 training pairs). Its "correct" completions mostly reach the right
#     answer through wrong steps, so the pairs are much harder to learn; kept as the hard case.
stage pairs_train_a $RL rm pairs --model "$(last_ckpt sft_a)" "${TASK[@]}" split=train pairs.n=8 pairs.max_pairs=6000 \
  pairs.max_new_tokens=40
stage pairs_test_a  $RL rm pairs --model "$(last_ckpt sft_a)" "${TASK[@]}" split=test pairs.n=8 pairs.max_new_tokens=40
stage bt_minilm_a $RL rm train --model minilm --data "$OUT/pairs_train_a/pairs.jsonl" \
  eval_data="$OUT/pairs_test_a/pairs.jsonl" train.epochs=2 train.batch_size=32 train.lr=5e-5 train.eval_every=75
stage eval_bt_minilm_a_pairs $RL rm eval --model "$(last_ckpt bt_minilm_a)" --data "$OUT/pairs_test_a/pairs.jsonl"

# 4. Step labels (prm label): binary search for the first error (OmegaPRM) with k=8 Monte Carlo rollouts per
#    prefix on 4,000 training questions x 4 solutions; exact labels (from the step checker) for the held-out ones.
stage labels_train $RL prm label --model "$(last_ckpt sft_b)" "${TASK[@]}" split=train label.method=binary label.k=8 \
  label.limit=4000 label.solutions_per_question=4 label.max_new_tokens=40
stage labels_test  $RL prm label --model "$(last_ckpt sft_b)" "${TASK[@]}" split=test label.method=reference \
  label.solutions_per_question=4 label.max_new_tokens=40

# 5. PRM on the MC labels, and an outcome (BT) model on the same backbone from the same policy's pairs (stage 2).
stage prm_tiny $RL prm train --model "$(last_ckpt sft_b)" --data "$OUT/labels_train/labels.jsonl" \
  train.epochs=3 train.batch_size=32 train.lr=1e-3 train.warmup_steps=10
stage bt_tiny  $RL rm train --model "$(last_ckpt sft_b)" --data "$OUT/pairs_train/pairs.jsonl" \
  train.epochs=3 train.batch_size=32 train.lr=1e-3 train.warmup_steps=10
# 5b. A PRM on the same MC labels with the MiniLM backbone, to compare with the MiniLM ORM of stage 3.
stage prm_minilm $RL prm train --model minilm --data "$OUT/labels_train/labels.jsonl" \
  train.epochs=3 train.batch_size=32 train.lr=5e-5 train.warmup_steps=10

# 6. First-error F1 on the held-out exact labels (threshold chosen on a 30% dev split of them).
stage fe_prm_tiny  $RL rm eval --model "$(last_ckpt prm_tiny)"  --data "$OUT/labels_test/labels.jsonl"
stage fe_bt_tiny   $RL rm eval --model "$(last_ckpt bt_tiny)"   --data "$OUT/labels_test/labels.jsonl"
stage fe_prm_minilm $RL rm eval --model "$(last_ckpt prm_minilm)" --data "$OUT/labels_test/labels.jsonl"
stage fe_bt_minilm $RL rm eval --model "$(last_ckpt bt_minilm)" --data "$OUT/labels_test/labels.jsonl"
stage fe_verifier  $RL rm eval "scorer=[{name: worked_answer}]" --data "$OUT/labels_test/labels.jsonl"

# 7. The table.
"$PYTHON" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

from rewardlab.rm.labels import reference_first_error, solution_steps

out = Path(sys.argv[1])
load = lambda name, f="report.json": json.loads((out / name / f).read_text())
for name in ("eval_sft_a", "eval_sft_b"):
    s = load(name, "summary.json")
    print(f"{name}: greedy accuracy {s['accuracy']:.1%}, pass@1 {s['pass@1']:.1%} on {s['n_questions']} held-out questions")
for policy, train_dir, test_dir, eval_dir in (("B", "pairs_train", "pairs_test", "eval_bt_minilm_pairs"),
                                              ("A", "pairs_train_a", "pairs_test_a", "eval_bt_minilm_a_pairs")):
    pairs = load(eval_dir)["pairs"]
    lb = pairs["length_bias"]
    n, chosen_longer, rejected_longer = pairs["n"], lb["n_chosen_longer"], lb["n_rejected_longer"]
    ties = n - chosen_longer - rejected_longer
    rows = [json.loads(line) for line in (out / test_dir / "pairs.jsonl").read_text().splitlines()]
    clean = sum(reference_first_error(r["row"], solution_steps(r["chosen"])) == -1 for r in rows)
    length_rule = max(lb["longer_wins_accuracy"], (chosen_longer + ties / 2) / n)
    print(f"\nheld-out pairs from policy {policy}: {n} ({load(train_dir, 'summary.json')['pairs']} training pairs); "
          f"chosen completions with every step right: {clean / n:.1%}")
    print(f"  MiniLM Bradley-Terry      {pairs['accuracy']:.1%}   (bar: 15 points above random and the length rule, "
          f"{0.15 + max(0.5, length_rule):.1%})")
    print(f"  random                    50.0%")
    print(f"  length rule, ties wrong   {lb['longer_wins_accuracy']:.1%}  (longer chosen {chosen_longer}, longer "
          f"rejected {rejected_longer}, equal length {ties})")
    print(f"  length rule, ties halved  {(chosen_longer + ties / 2) / n:.1%}")
    print(f"  master-key rate           {pairs['master_keys']['rate']:.1%}")
print("\nfirst-error identification on held-out exact labels (threshold from the dev split):")
print(f"  {'scorer':<46} {'kind':<8} {'F1':>6} {'err acc':>8} {'ok acc':>7}")
for name, label in (("fe_prm_tiny", "PRM, tiny backbone, MC (binary search) labels"),
                    ("fe_bt_tiny", "ORM (Bradley-Terry), same tiny backbone"),
                    ("fe_prm_minilm", "PRM, MiniLM, the same MC labels"),
                    ("fe_bt_minilm", "ORM (Bradley-Terry), MiniLM"),
                    ("fe_verifier", "exact final-answer check (outcome ceiling)")):
    fe = load(name)["first_error"]
    print(f"  {label:<46} {fe['scorer_kind']:<8} {fe['f1']:>6.3f} {fe['error_acc']:>8.3f} {fe['correct_acc']:>7.3f}"
          f"   (n={fe['n']})")
EOF
