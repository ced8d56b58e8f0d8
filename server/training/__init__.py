"""Drafter training: runs where the target runs.

One command per stage, each resumable (run it again to continue):

    edgespec train data --target qwen2.5-coder-0.5b-instruct --out runs/data/qwen0.5b
        prompts derived from the Python standard library on this machine (prompts.py) and
        the target's own greedy chat responses (data.py) -> samples.jsonl, with a
        validation split by id hash; HumanEval / MT-Bench never enter
    edgespec train features --target ... --data runs/data/qwen0.5b --out runs/features/qwen0.5b
        one target pass per sample: hidden states, all-layer K|V, TLI activations, int8
        (features.py)
    edgespec train fit --kind eagle|moa [--tli N] --target ... --features ... --out runs/fit/NAME
        recipe (eagle_recipe.py, moa_recipe.py) + trainer (trainer.py): logs loss and
        per-position validation acceptance, checkpoints, writes the drafter and card.json

Modules: prompts, data, features, losses (pure loss / acceptance functions), recipe (the
recipe protocol and loss terms), eagle_recipe, moa_recipe, trainer, fit, cli.
"""
