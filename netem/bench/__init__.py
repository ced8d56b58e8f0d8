"""edgespec.netem.bench: every benchmark, as `edgespec bench NAME` (cli.py).

Shared pieces:
- prompt_sets.py: HumanEval and the first turns of MT-Bench
- server_process.py: `edgespec server` in a child process (the experiments' server)
- loopback.py: the server in this process and the link to it (micro-benchmarks); a relay in front of an address
- records.py: a run's environment and its JSON lines
- report.py, plots.py: the experiments' Markdown report and its plots; the README splice
- sandbox.py: HumanEval answers scored in a sandboxed subprocess

Experiments under emulated networks: experiments.py (speed, link, disconnect, codec).
Micro-benchmarks, a module each: server_engines.py (the server's engines), drafting.py (every drafter against plain decoding and transformers'
assisted generation), tree_sweep.py, independent.py, router.py, beagle.py, activation_codec.py,
near_ties.py.
"""
