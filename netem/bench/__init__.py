"""edgespec.netem.bench: every benchmark, as `edgespec bench NAME` (cli.py lists them: the experiments under
emulated networks, experiments.py and specbench.py, and the micro-benchmarks, a module each).

Shared pieces:
- prompt_sets.py: HumanEval and the first turns of MT-Bench
- server_process.py: `edgespec server` in a child process (the experiments' server)
- loopback.py: the server in this process and the link to it (micro-benchmarks); a relay in front of an address
- records.py: a run's environment and its JSON lines
- systems.py: what the experiments run a prompt through (a drafter's client, the plain API), and their progress bar
- report.py, plots.py: the experiments' Markdown report and its plots; the README splice
- sandbox.py: HumanEval answers scored in a sandboxed subprocess
"""
